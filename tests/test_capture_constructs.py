"""Capture of the JAX constructs real code uses: combining scatters, custom_linear_solve,
complex values, named tuples, remat, jacobians, batched while loops, rounding, PRNG keys,
lax.reduce with a custom computation. Each program runs like ``jax.jit`` of the function,
saves, loads, prints the same and differentiates the same."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax import lax

import paddlejax as pj


def assert_tree_close(a, b, atol=1e-5):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-5)


def round_trip(prog, tmp_path):
    pj.save(prog, tmp_path / "m")
    loaded = pj.load(tmp_path / "m")
    assert str(loaded) == str(prog)
    return loaded


def captured(fn, *args, tmp_path, atol=1e-5):
    """Trace, check the program and its reloaded copy against jax.jit(fn); the loaded program."""
    prog = pj.trace(fn, *args)
    want = jax.jit(fn)(*args)
    assert_tree_close(prog(*args), want, atol)
    loaded = round_trip(prog, tmp_path)
    assert_tree_close(loaded(*args), want, atol)
    return loaded


def op_types(prog):
    return [op.type for op in prog.walk()]


@pytest.mark.parametrize("fn", [
    lambda x, i: x.at[i].add(1.0),
    lambda x, i: x.at[i].min(-1.0),
    lambda x, i: x.at[i].max(7.0),
    lambda x, i: x.at[i].multiply(3.0),
    lambda x, i: x.at[i].subtract(2.0),
    lambda x, i: jax.ops.segment_sum(x, i, 5),
    lambda x, i: jnp.bincount(i, length=5),
    lambda x, i: jnp.histogram(x, bins=3, range=(0.0, 5.0))[0],
    lambda x, i: jnp.unique(i, size=5, fill_value=-1),
    lambda x, i: jnp.nonzero(i, size=5)[0],
], ids=["add", "min", "max", "multiply", "subtract", "segment_sum", "bincount", "histogram", "unique",
        "nonzero"])
def test_scatters_that_combine_values_are_captured(fn, tmp_path):
    x, i = jnp.arange(5.0), jnp.array([0, 2, 2, 4, 0])
    prog = captured(fn, x, i, tmp_path=tmp_path)
    scatters = [op for op in prog.walk() if op.type.startswith("lax.scatter")]
    assert scatters and all("update_jaxpr" not in op.attrs for op in scatters)


def test_scatter_gradients_match_jax(tmp_path):
    def f(x, u):
        return jnp.sum(x.at[jnp.array([0, 1, 0])].add(u) ** 2)

    x, u = jnp.arange(3.0), jnp.array([1.0, 2.0, 3.0])
    prog = captured(f, x, u, tmp_path=tmp_path)
    assert_tree_close(jax.grad(lambda *a: prog.apply(prog.params, *a), (0, 1))(x, u), jax.grad(f, (0, 1))(x, u))


def test_scatter_applying_a_function_is_refused_with_advice():
    with pytest.raises(pj.CaptureError, match=r"test_capture_constructs\.py:\d+.*apply.*x\.at\[i\]\.set"):
        pj.trace(lambda x: x.at[jnp.array([0, 1])].apply(jnp.sin), jnp.arange(3.0))


@pytest.mark.parametrize("fn", [lambda a: jnp.linalg.solve(a, jnp.arange(3.0)), jnp.linalg.inv,
                                jax.scipy.linalg.expm], ids=["solve", "inv", "expm"])
def test_custom_linear_solve_holds_its_functions_as_blocks(fn, tmp_path):
    a = jnp.array([[2.0, 0.3, 0.1], [0.2, 1.5, 0.4], [0.1, 0.2, 1.2]]) * 0.5
    prog = captured(fn, a, tmp_path=tmp_path)
    solve = next(op for op in prog.walk() if op.type == "custom_linear_solve")
    assert [b.name for b in solve.blocks] == ["matvec", "vecmat", "solve", "transpose_solve"]
    assert "matvec(" in str(prog)

    def loss(f):
        return lambda a: jnp.sum(jnp.sin(f(a)))

    got = jax.grad(loss(lambda a: prog.apply(prog.params, a)))(a)
    assert_tree_close(got, jax.grad(loss(fn))(a), atol=1e-4)
    assert_tree_close(jax.jacfwd(lambda a: prog.apply(prog.params, a))(a), jax.jacfwd(fn)(a), atol=1e-4)


def test_custom_linear_solve_without_transpose_and_with_aux(tmp_path):
    def f(a, b):
        def solve(matvec, b):
            return b / jnp.diag(a), jnp.sum(b)
        return lax.custom_linear_solve(lambda x: a @ x, b, solve, has_aux=True)

    a, b = jnp.diag(jnp.array([2.0, 4.0])), jnp.array([1.0, 2.0])
    prog = captured(f, a, b, tmp_path=tmp_path)
    solve = next(op for op in prog.walk() if op.type == "custom_linear_solve")
    assert [blk.name for blk in solve.blocks] == ["matvec", "solve"]
    assert_tree_close(jax.jvp(lambda b: prog.apply({}, a, b)[0], (b,), (b,)), jax.jvp(lambda b: f(a, b)[0], (b,), (b,)))


@pytest.mark.parametrize("fn", [jnp.fft.fft, lambda x: jnp.fft.irfft(jnp.fft.rfft(x)), jnp.fft.fftshift,
                                lambda x: jnp.linalg.eigvals(jnp.outer(x, x) + jnp.eye(4))],
                         ids=["fft", "rfft-irfft", "fftshift", "eigvals"])
def test_complex_values_run_save_and_load(fn, tmp_path):
    loaded = captured(fn, jnp.array([1.0, 2.0, 0.5, -1.0]), tmp_path=tmp_path, atol=1e-4)
    assert "c64" in str(loaded) or fn is jnp.fft.fftshift


def test_version_2_files_with_integer_enums_are_migrated(tmp_path):
    prog = pj.trace(lambda x: jnp.abs(jnp.fft.fft(jnp.round(x).at[jnp.array([1])].set(5.0))), jnp.ones(4))
    pj.save(prog, tmp_path / "m")
    path = tmp_path / "m.json"
    doc = json.loads(path.read_text())
    assert {"enum": "RoundingMethod", "value": "TO_NEAREST_EVEN"} in [
        op.get("attrs", {}).get("rounding_method") for op in doc["body"]["ops"]]
    for op in doc["body"]["ops"]:  # how version 2 wrote them
        for name, cls in (("rounding_method", lax.RoundingMethod), ("fft_type", lax.FftType)):
            if name in op.get("attrs", {}):
                op["attrs"][name] = cls[op["attrs"][name]["value"]].value
        if op["type"] == "lax.scatter":
            op["attrs"].update(update_jaxpr=None, update_consts={"tuple": []})
    doc["format_version"] = 2
    path.write_text(json.dumps(doc))
    loaded = pj.load(tmp_path / "m")
    assert str(loaded) == str(prog) and "rounding_method=RoundingMethod.TO_NEAREST_EVEN" in str(loaded)
    x = jnp.array([0.5, 1.5, 2.5, -0.5])
    assert_tree_close(loaded(x), prog(x))


def test_round_prints_its_method_and_loads(tmp_path):
    loaded = captured(lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO) + jnp.round(x),
                      jnp.array([0.5, 1.5, 2.5, -0.5]), tmp_path=tmp_path)
    assert "RoundingMethod.AWAY_FROM_ZERO" in str(loaded) and "RoundingMethod.TO_NEAREST_EVEN" in str(loaded)


def test_named_tuple_outputs_and_inputs_save_and_load(tmp_path):
    loaded = captured(jnp.linalg.qr, jnp.eye(3) + 0.1, tmp_path=tmp_path)
    q, r = loaded(jnp.eye(3))
    assert type(loaded(jnp.eye(3))).__name__ == "QRResult"

    opt = optax.adam(0.1)
    params = {"w": jnp.ones(3)}
    state = opt.init(params)
    loaded = captured(lambda g, s: opt.update(g, s, params), params, state, tmp_path=tmp_path / "adam")
    updates, new_state = loaded(params, state)
    assert type(new_state[0]) is type(state[0])  # the class is the one optax defined


def test_a_named_tuple_whose_class_is_not_imported_loads_as_a_stand_in(tmp_path):
    prog = pj.trace(jnp.linalg.qr, jnp.eye(2))
    pj.save(prog, tmp_path / "m")
    path = tmp_path / "m.json"
    path.write_text(path.read_text().replace("jax._src.numpy.linalg:QRResult", "not_imported.module:QRResult"))
    out = pj.load(tmp_path / "m")(jnp.eye(2))
    assert type(out).__name__ == "QRResult" and out._fields == ("Q", "R")
    assert type(out).__module__ != "jax._src.numpy.linalg"


def test_checkpoint_becomes_a_remat_segment(tmp_path):
    def f(x):
        y = jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)) * 2.0)(x)
        return jnp.sum(jax.checkpoint(jnp.cos)(y))

    x = jnp.arange(3.0)
    prog = captured(f, x, tmp_path=tmp_path)
    segments = [op.attrs.get("remat_segment") for op in prog.walk() if op.type in ("lax.sin", "lax.cos")]
    assert segments == [0, 0, 1]
    assert_tree_close(jax.grad(lambda x: prog.apply({}, x))(x), jax.grad(f)(x))


@pytest.mark.parametrize("transform", [jax.hessian, jax.jacfwd, jax.jacrev], ids=["hessian", "jacfwd", "jacrev"])
def test_jacobians_inside_a_traced_function(transform, tmp_path):
    def f(x):
        return transform(lambda x: jnp.sum(jnp.sin(x) * x ** 2))(x)

    captured(f, jnp.arange(3.0), tmp_path=tmp_path)


def test_grad_of_scan_inside_a_traced_function(tmp_path):
    f = jax.grad(lambda x: lax.scan(lambda c, a: (c * a + jnp.sin(c), c), 1.0, x)[0])
    captured(f, jnp.arange(1.0, 4.0), tmp_path=tmp_path)


def test_vmap_of_a_while_loop_with_a_predicate_per_row(tmp_path):
    def f(n, x):
        return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 2.0 + x), (0, x))[1]

    n, x = jnp.array([1, 3, 0, 2]), jnp.array([1.0, 0.5, 2.0, -1.0])
    batched = jax.vmap(f)
    prog = captured(batched, n, x, tmp_path=tmp_path)
    loop = next(op for op in prog.walk() if op.type == "while")
    assert str(loop.blocks[0].results[0].type) == "bool[4]"
    np.testing.assert_array_equal(prog(n, x), [f(a, b) for a, b in zip(n, x)])


def test_raw_keys_go_into_jax_random_functions(tmp_path):
    def f(raw, x):
        k1, k2 = jax.random.split(raw)
        keys = jax.random.split(k1, 3)
        noise = jax.random.normal(k2, x.shape) + jax.random.uniform(keys[1], x.shape)
        mask = jax.random.bernoulli(jax.random.fold_in(k1, 7), 0.5, x.shape)
        new = jax.random.key_data(jax.random.fold_in(jax.random.wrap_key_data(raw), 1))
        return x * mask + noise + jax.random.normal(jax.random.key(3), x.shape), new

    raw, x = jax.random.PRNGKey(42), jnp.arange(4.0)
    prog = captured(f, raw, x, tmp_path=tmp_path, atol=1e-6)
    assert prog.inputs[0].type == pj.ir.TensorType((2,), "uint32")
    assert "threefry2x32" in " ".join(op_types(prog))
    assert all(op.loc and "test_capture_constructs.py" in op.loc for op in prog.walk()
               if op.type == "lax.threefry2x32")
    assert_tree_close(jax.grad(lambda x: prog.apply({}, raw, x)[0].sum())(x), jax.grad(lambda x: f(raw, x)[0].sum())(x))


def test_typed_keys_at_the_program_boundary_are_refused_with_advice():
    with pytest.raises(pj.CaptureError, match=r"input 'key' is a typed PRNG key.*key_data.*wrap_key_data"):
        pj.trace(lambda key: jax.random.normal(key, (2,)), jax.random.key(0))
    with pytest.raises(pj.CaptureError, match=r"output 0 is a typed PRNG key.*key_data"):
        pj.trace(lambda raw: jax.random.wrap_key_data(raw), jax.random.PRNGKey(0))
    with pytest.raises(pj.CaptureError, match=r"test_capture_constructs\.py:\d+: 'scatter' on an array of typed "
                                              r"PRNG keys.*key_data"):
        pj.trace(lambda raw: jax.random.normal(jax.random.split(jax.random.wrap_key_data(raw), 3).at[0].set(
            jax.random.key(1))[0], ()), jax.random.PRNGKey(0))


def _pure(module):
    graphdef, state = nnx.split(module)

    def call(state, x):
        return nnx.merge(graphdef, state)(x)

    return lambda x: jax.jit(call)(state, x)


def test_training_dropout_and_rnn_modules(tmp_path):
    drop = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=3))
    x = jnp.arange(1.0, 9.0)
    prog = pj.trace(drop, x)
    assert_tree_close(prog(x), _pure(drop)(x))
    assert sorted(set(np.asarray(prog(x)).tolist()) - {0.0}) != []  # some kept, scaled by 2
    assert round_trip(prog, tmp_path)(x).tolist() == prog(x).tolist()

    rnn = nnx.RNN(nnx.LSTMCell(2, 3, rngs=nnx.Rngs(0)))
    xs = jnp.linspace(-1.0, 1.0, 8).reshape(1, 4, 2)
    prog = pj.trace(rnn, xs)
    assert_tree_close(prog(xs), _pure(rnn)(xs))
    assert_tree_close(round_trip(prog, tmp_path / "rnn")(xs), prog(xs))
    weights = {k: v for k, v in prog.params.items() if jnp.issubdtype(v.dtype, jnp.floating)}
    rest = {k: v for k, v in prog.params.items() if k not in weights}
    grads = jax.grad(lambda w: prog.apply({**w, **rest}, xs).sum())(weights)
    want = nnx.grad(lambda m: m(xs).sum())(nnx.clone(rnn))
    norms = sorted(float(jnp.linalg.norm(g)) for g in jax.tree_util.tree_leaves(want))
    np.testing.assert_allclose(sorted(float(jnp.linalg.norm(g)) for g in grads.values()), norms, rtol=1e-5)


def test_lax_reduce_with_a_custom_computation(tmp_path):
    x = jnp.arange(6.0).reshape(2, 3) - 2.0
    captured(lambda x: lax.reduce(x, 0.0, lambda a, b: a + 2 * b * b, (0,)), x, tmp_path=tmp_path)
    prog = captured(lambda x: lax.reduce((x, -x), (0.0, 1.0), lambda a, b: (a[0] + b[0], a[1] * b[1]), (1,)),
                    x, tmp_path=tmp_path / "pair")
    (op,) = [op for op in prog.walk() if op.type == "reduce"]
    assert op.attrs == {"dimensions": (1,)} and op.blocks[0].name == "computation"


def test_complex_scalar_constants_are_saved_as_tensors(tmp_path):
    prog = captured(lambda x: jnp.abs(jnp.exp(1j * x) * (2.0 - 1.0j)), jnp.arange(3.0), tmp_path=tmp_path)
    assert any(np.iscomplexobj(v) and np.ndim(v) == 0 for v in prog.constants.values())


def test_integer_outputs_of_functions_with_custom_jvp_rules_save_and_load(tmp_path):
    prog = captured(jnp.frexp, jnp.array([0.3, 5.0, -2.0]), tmp_path=tmp_path)
    assert not any(op.result.type.dtype == "float0" for op in prog.walk() if len(op.results) == 1)


def test_device_put_without_a_device_is_the_identity(tmp_path):
    prog = captured(lambda k: jax.random.randint(k, (4,), 0, 10) + jax.device_put(1), jax.random.PRNGKey(1),
                    tmp_path=tmp_path)
    assert "device_put" not in str(prog)


@pytest.mark.parametrize("fn", [lambda k, x: jax.random.permutation(k, x), lambda k, x: jax.random.choice(k, x, (2,)),
                                lambda k, x: jax.vmap(lambda k: jax.random.normal(k, ()))(jax.random.split(k, 5)) * x,
                                lambda k, x: x * jax.random.normal(lax.select(x[1] > 0, jax.random.wrap_key_data(k),
                                                                              jax.random.key(1)), ())],
                         ids=["permutation", "choice", "vmap-over-keys", "select"])
def test_shape_operations_on_key_arrays_act_on_their_data(fn, tmp_path):
    captured(fn, jax.random.PRNGKey(3), jnp.arange(5.0), tmp_path=tmp_path)


def test_random_gamma_keeps_its_derivative(tmp_path):
    def f(raw, a):
        return jax.random.gamma(raw, a, (3,))

    raw, a = jax.random.PRNGKey(0), jnp.array([0.5, 2.0, 4.0])
    prog = captured(f, raw, a, tmp_path=tmp_path)
    assert "lax.random_gamma" in op_types(prog)
    assert_tree_close(jax.grad(lambda a: prog.apply({}, raw, a).sum())(a), jax.grad(lambda a: f(raw, a).sum())(a))


def test_psum_over_a_vmapped_axis(tmp_path):
    f = jax.vmap(lambda r: r - lax.pmean(r, "i"), axis_name="i")
    captured(f, jnp.arange(6.0).reshape(2, 3), tmp_path=tmp_path)


def _first(block, kind):
    for op in block["ops"]:
        if op["type"] == kind:
            return op
        for sub in op.get("blocks", []):
            found = _first(sub, kind)
            if found:
                return found
    return None


@pytest.mark.parametrize("fn,args,kind,change,message", [
    (jnp.linalg.inv, (jnp.eye(2) * 2,), "custom_linear_solve",
     lambda op: op["attrs"].update(const_lengths={"tuple": [9, 9, 9, 9]}), "const_lengths"),
    (jnp.linalg.inv, (jnp.eye(2) * 2,), "custom_linear_solve",
     lambda op: op["blocks"].pop(1), r"holds blocks \(matvec, solve\)"),
    (lambda x: lax.reduce(x, 0.0, lambda a, b: a + b * b, (1,)), (jnp.ones((2, 3)),), "reduce",
     lambda op: op["attrs"].update(dimensions={"tuple": [5]}), "not distinct axes"),
    (jax.vmap(lambda n: lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1]), (0, 1.0))[1]),
     (jnp.array([1, 2]),), "while", lambda op: op["blocks"][0]["ops"].__setitem__(
         -1, {"type": "return", "operands": [op["blocks"][0]["args"][0]["id"]]}), "a bool per row"),
], ids=["solve-counts", "solve-blocks", "reduce-dims", "while-predicate"])
def test_malformed_blocks_of_the_new_ops_are_refused_on_load(fn, args, kind, change, message, tmp_path):
    pj.save(pj.trace(fn, *args), tmp_path / "m")
    path = tmp_path / "m.json"
    doc = json.loads(path.read_text())
    change(_first(doc["body"], kind))
    path.write_text(json.dumps(doc))
    with pytest.raises(pj.ProgramFormatError, match=message):
        pj.load(tmp_path / "m")


def test_numpy_constants_take_the_dtype_jax_computes_in(tmp_path):
    table = np.array([1.0 + 1.0j, 2.0 - 0.5j])  # complex128, as float64 tables are float64

    prog = captured(lambda x: jnp.abs(x * table) + np.float64(0.5) * np.arange(2.0), jnp.ones(2), tmp_path=tmp_path)
    assert {np.asarray(v).dtype.name for v in prog.constants.values()} <= {"complex64", "float32"}
