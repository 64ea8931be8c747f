"""Sparsity: magnitude and N:M masks over the weights the op traits name, pruned programs, masks
kept through fine-tuning, compact saving, and accuracy on the digits CNN."""
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax as pj
from paddlejax.nn.program_layer import ProgramLayer
from paddlejax.slim.sparsity import (apply_masks, check_sparsity, create_masks, decorate, leaf_masks, magnitude_mask,
                                     nm_mask, prunable_weights, prune_program, sparsity)

RNG = np.random.default_rng(0)


def conv_net(p, x):
    h = pj.ops.relu(pj.ops.conv2d(x, p["conv.w"], padding=1))
    h = pj.ops.depthwise_conv2d(h, p["dw.w"], padding=1)
    h = pj.ops.reshape(h, shape=(0, -1)) @ p["proj.w"]  # a plain product: reads as matmul
    return pj.ops.linear(h + p["emb.w"][0], p["fc.w"], p["fc.b"])


@pytest.fixture
def prog():
    """conv2d [8, 4, 3, 3], depthwise [8, 1, 3, 3], ``x @ w`` [128, 16], linear [16, 8] + bias, and
    an ``emb.w`` added as data (no op reads it as a weight)."""
    shapes = {"conv.w": (8, 4, 3, 3), "dw.w": (8, 1, 3, 3), "proj.w": (128, 16), "emb.w": (3, 16), "fc.w": (16, 8),
              "fc.b": (8,)}
    params = {k: RNG.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    return pj.trace(conv_net, pj.InputSpec((None, 4, 4, 4)), params=params)


# -- masks of arrays ------------------------------------------------------------------------------------

def test_a_magnitude_mask_zeroes_exactly_the_ratio_of_smallest_magnitudes():
    w = RNG.normal(size=(10, 10))
    keep = magnitude_mask(w, 0.75)
    assert keep.shape == (10, 10) and keep.sum() == 25
    assert np.abs(w[keep]).min() >= np.abs(w[~keep]).max()
    assert magnitude_mask(np.zeros(8), 0.5).sum() == 4  # ties: the count is still exact
    assert magnitude_mask(w, 0.0).all()


def test_an_n_m_mask_keeps_the_n_largest_of_every_m_along_its_axis():
    w = RNG.normal(size=(3, 8, 5))
    keep = nm_mask(w, 2, 4, axis=1)
    groups = np.moveaxis(keep, 1, -1).reshape(3, 5, 2, 4)
    assert (groups.sum(-1) == 2).all()
    assert check_sparsity(w * keep, 2, 4, axis=1) and not check_sparsity(w * keep, 2, 4, axis=2)
    magnitudes = np.moveaxis(np.abs(w), 1, -1).reshape(3, 5, 2, 4)
    assert (np.where(groups, magnitudes, np.inf).min(-1) >= np.where(groups, -np.inf, magnitudes).max(-1)).all()
    assert nm_mask(np.arange(1.0, 7.0), 2, 4).tolist() == [False, False, True, True, True, True]  # short last group
    assert nm_mask(np.arange(1.0, 9.0), 1, 4).sum() == 2


def test_a_greedy_2d_mask_is_n_m_along_rows_and_columns():
    w = RNG.normal(size=(16, 12))
    keep = nm_mask(w, 2, 4, axis=1, mask_algo="mask_2d_greedy")
    blocks = keep.reshape(4, 4, 3, 4)
    assert (blocks.sum(3) <= 2).all() and (blocks.sum(1) <= 2).all()
    assert 0.4 < keep.mean() <= 0.5  # greedy: a few blocks keep fewer than n per row
    assert check_sparsity(w * keep, axis=1, mask_algo="mask_2d_greedy")
    assert check_sparsity(w * keep, axis=0) and check_sparsity(w * keep, axis=1)
    row_only = w * nm_mask(w, 2, 4, axis=1)
    assert not check_sparsity(row_only, axis=1, mask_algo="mask_2d_greedy")


@pytest.mark.parametrize("call, message", [
    (lambda: magnitude_mask(np.ones(4), 1.0), r"ratio is the fraction of weights to zero, in \[0, 1\); got 1.0"),
    (lambda: nm_mask(np.ones(4), 4, 4), "0 < n < m; got n=4, m=4"),
    (lambda: nm_mask(np.ones(4), mask_algo="mask_3d"), "mask_algo must be one of mask_1d, mask_2d_greedy"),
    (lambda: check_sparsity(np.ones(4), 0, 4), "0 < n < m"),
])
def test_bad_mask_arguments_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# -- masks of programs ----------------------------------------------------------------------------------

def test_the_weights_are_what_the_op_traits_name_with_their_input_channel_axes(prog):
    assert prunable_weights(prog, min_size=0) == {"conv.w": 1, "dw.w": 1, "proj.w": 0, "fc.w": 0}
    assert prunable_weights(prog) == {"proj.w": 0}  # 2,048 elements; the rest are under 1,024
    assert prunable_weights(prog, exclude=["proj.w", "dw.w"], min_size=0) == {"conv.w": 1, "fc.w": 0}
    with pytest.raises(ValueError, match=r"exclude names \['fc.b'\], which no op reads as a weight"):
        prunable_weights(prog, exclude=["fc.b"])


def test_a_transposed_product_has_no_known_input_axis_and_stays_dense_under_n_m():
    w = RNG.normal(size=(8, 16)).astype(np.float32)
    prog = pj.trace(lambda p, x: pj.ops.matmul(x, p["w"], transpose_y=True), pj.InputSpec((None, 16)), params={"w": w})
    assert prunable_weights(prog, min_size=0) == {"w": None}
    assert create_masks(prog, min_size=0) == {}
    assert create_masks(prog, 0.5, min_size=0)["w"].sum() == 64  # magnitude masks need no axis


def test_prune_program_2_4_follows_each_weights_input_channels(prog):
    sparse, masks = prune_program(prog, min_size=0)
    # the depthwise weight has one input channel per group: fewer than m, dense as in Paddle's ASP
    assert sorted(masks) == ["conv.w", "fc.w", "proj.w"]
    assert check_sparsity(sparse.params["conv.w"], 2, 4, axis=1)
    assert check_sparsity(sparse.params["proj.w"], 2, 4, axis=0) and check_sparsity(sparse.params["fc.w"], axis=0)
    assert sparsity(sparse) == {"conv.w": 0.5, "dw.w": 1.0, "proj.w": 0.5, "fc.w": 0.5}
    assert sparsity(prog)["conv.w"] == 1.0  # the source program is untouched
    x = RNG.normal(size=(2, 4, 4, 4)).astype(np.float32)
    masked = {k: np.where(masks[k], v, 0) if k in masks else v for k, v in prog.params.items()}
    np.testing.assert_allclose(np.asarray(sparse(x)), np.asarray(prog.apply(masked, x)), rtol=1e-5, atol=1e-5)


def test_greedy_2d_masks_of_a_program(prog):
    sparse, _ = prune_program(prog, n=2, m=4, mask_algo="mask_2d_greedy", min_size=0)
    assert check_sparsity(sparse.params["proj.w"], axis=0, mask_algo="mask_2d_greedy")
    assert check_sparsity(sparse.params["proj.w"], axis=1)  # the transposed weight is 2:4 too


def test_magnitude_masks_per_weight_and_global():
    small, large = np.full((32, 32), 0.01, np.float32), np.ones((32, 32), np.float32)
    small[0, :8] = 5.0  # the 8 largest weights of all sit in the small one
    prog = pj.trace(lambda p, x: pj.ops.linear(pj.ops.linear(x, p["a"]), p["b"]), pj.InputSpec((None, 32)),
                    params={"a": small, "b": large})
    per_weight, _ = prune_program(prog, 0.75)
    assert sparsity(per_weight) == {"a": 0.25, "b": 0.25}
    overall, masks = prune_program(prog, 0.75, scope="global")
    assert sparsity(overall) == {"a": 8 / 1024, "b": 504 / 1024}  # a quarter of all 2,048 kept, largest first
    assert sum(int(m.sum()) for m in masks.values()) == 512


@pytest.mark.parametrize("kwargs, message", [
    ({"ratio": 0.5, "n": 2}, "give ratio \\(unstructured\\) or n and m \\(N:M\\), not both"),
    ({"ratio": 0.5, "scope": "layer"}, "scope must be one of tensor, global"),
    ({"n": 3, "m": 2}, "0 < n < m"),
])
def test_bad_program_mask_arguments_are_refused(prog, kwargs, message):
    with pytest.raises(ValueError, match=message):
        prune_program(prog, **kwargs)


def test_apply_masks_checks_names_and_shapes(prog):
    with pytest.raises(ValueError, match="mask 'nope' names no parameter of conv_net"):
        apply_masks(prog, {"nope": np.ones(3, bool)})
    with pytest.raises(ValueError, match=r"mask 'fc.w' is bool\[8, 16\]; the weight needs bool\[16, 8\]"):
        apply_masks(prog, {"fc.w": np.ones((8, 16), bool)})


# -- keeping the zeros through fine-tuning --------------------------------------------------------------

@pytest.fixture
def mlp():
    """A two-layer MLP program and a separable task for it."""
    x = RNG.normal(size=(256, 16)).astype(np.float32)
    y = (x[:, :4].sum(1) > 0).astype(np.int32)
    params = {"l1.w": (0.3 * RNG.normal(size=(16, 64))).astype(np.float32), "l1.b": np.zeros(64, np.float32),
              "l2.w": (0.3 * RNG.normal(size=(64, 2))).astype(np.float32)}
    prog = pj.trace(lambda p, x: pj.ops.linear(pj.ops.relu(pj.ops.linear(x, p["l1.w"], p["l1.b"])), p["l2.w"]),
                    pj.InputSpec((None, 16)), params=params)
    return prog, (x, y)


def test_the_trainer_keeps_the_zeros_of_a_decorated_optimizer_and_the_loss_falls(mlp):
    prog, data = mlp
    sparse, masks = prune_program(prog, 0.75, min_size=0)
    layer = ProgramLayer(sparse)
    trainer = pj.Trainer(layer, decorate(optax.adamw(1e-2, weight_decay=0.1), masks), weight_decay=1e-3,
                         progress=False)
    before = trainer.evaluate(data)["loss"]
    trainer.fit(data, epochs=4, batch_size=32)
    assert trainer.evaluate(data)["loss"] < 0.7 * before
    trainer.sync_model()
    for name, mask in masks.items():
        w = np.asarray(layer.params[name][...])
        assert (w[~mask] == 0).all() and (w[mask] != sparse.params[name][mask]).all()  # zeros stay, the rest train
    assert sparsity(pj.to_static(layer, pj.InputSpec((None, 16)))) == {"params.l1.w": 0.25, "params.l2.w": 0.25}


def test_without_decorate_the_zeros_fill_in(mlp):
    prog, data = mlp
    sparse, _ = prune_program(prog, 0.75, min_size=0)
    layer = ProgramLayer(sparse)
    pj.Trainer(layer, optax.adamw(1e-2), progress=False).fit(data, epochs=1, batch_size=32)
    assert np.count_nonzero(np.asarray(layer.params["l1.w"][...])) > 0.9 * 16 * 64


def test_decorate_zeroes_masked_weights_that_were_not_zero_and_keeps_them_under_momentum():
    tx = decorate(optax.sgd(0.1, momentum=0.9), {"w": np.array([True, False, True])})
    params = {"w": jnp.array([1.0, 2.0, 3.0])}
    state = tx.init(params)
    for _ in range(5):
        updates, state = tx.update({"w": jnp.ones(3)}, state, params)
        params = optax.apply_updates(params, updates)
        assert float(params["w"][1]) == 0.0
    assert params["w"][0] < 1.0 and params["w"][2] < 3.0


def test_decorate_works_with_nnx_optimizer(mlp):
    prog, (x, y) = mlp
    sparse, masks = prune_program(prog, n=1, m=4, min_size=0)
    layer = ProgramLayer(sparse)
    opt = nnx.Optimizer(layer, decorate(optax.adam(1e-2), masks), wrt=nnx.Param)  # leaves named params.N.value

    @nnx.jit
    def step(layer, opt):
        grads = nnx.grad(lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean())(layer)
        opt.update(layer, grads)

    for _ in range(3):
        step(layer, opt)
    assert check_sparsity(layer.params["l1.w"][...], 1, 4, axis=0)
    assert np.count_nonzero(np.asarray(layer.params["l1.w"][...])) == 16 * 64 // 4


def test_masks_are_matched_to_the_parameter_tree_by_name_or_refused_clearly():
    params = {"params.a.w": np.ones((2, 2)), "params.b.w": np.ones((3,)), "params.w": np.ones(3)}
    got = leaf_masks(params, {"a.w": np.eye(2, dtype=bool), "b.w": np.ones(3, bool)})
    assert [None if m is None else m.shape for m in got] == [(2, 2), (3,), None]
    assert leaf_masks(params, {"params.w": np.ones(3, bool)})[2] is not None  # a full path matches as it is
    assert leaf_masks(params, {}) == (None, None, None)  # nothing was masked (every weight under min_size)
    with pytest.raises(ValueError, match=r"masks \['c.w'\] name no parameter of the optimized tree \(its parameters: "
                                         r"params.a.w, params.b.w, params.w\)"):
        leaf_masks(params, {"a.w": np.eye(2, dtype=bool), "c.w": np.ones(3, bool)})
    with pytest.raises(ValueError, match=r"mask 'a.w' has shape \(3, 3\) but parameter 'params.a.w' has \(2, 2\)"):
        leaf_masks(params, {"a.w": np.ones((3, 3), bool)})
    with pytest.raises(ValueError, match=r"fit the parameters at several places \(params.\*, params.a.\*, "
                                         r"params.b.\*\); name them by their full paths"):
        leaf_masks(params, {"w": np.ones(3, bool)})
    with pytest.raises(ValueError, match="name no parameter"):
        decorate(optax.sgd(0.1), {"nope": np.ones(2, bool)}).init(params)


# -- saving ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, most", [({"ratio": 0.75}, 0.30), ({"n": 2, "m": 4}, 0.55)])
def test_a_sparse_program_saves_small_and_loads_the_same(tmp_path, kwargs, most):
    w = RNG.normal(size=(256, 128)).astype(np.float32)
    prog = pj.trace(lambda p, x: pj.ops.linear(x, p["w"]), pj.InputSpec((None, 256)), params={"w": w})
    sparse, _ = prune_program(prog, **kwargs)
    pj.save(sparse, tmp_path / "dense")
    pj.save(sparse, tmp_path / "sparse", sparse=True)
    ratio = (tmp_path / "sparse.safetensors").stat().st_size / (tmp_path / "dense.safetensors").stat().st_size
    assert ratio < most  # 75 %: 0.25 of the values + 1/32 for the bitmask; 2:4: 0.5 + 1/32
    loaded = pj.load(tmp_path / "sparse")
    np.testing.assert_array_equal(loaded.params["w"], sparse.params["w"])
    assert str(loaded) == str(sparse)


# -- accuracy -------------------------------------------------------------------------------------------

def _accuracy(program, x, y) -> float:
    return float((np.asarray(program(x)).argmax(1) == y).mean())


@pytest.mark.slow  # trains the session's digits CNN (shared with the quantization tests), then fine-tunes twice
@pytest.mark.parametrize("kwargs", [{"n": 2, "m": 4}, {"ratio": 0.75}])
def test_digits_cnn_keeps_its_accuracy_sparse_after_a_short_fine_tune(digits, kwargs):
    base = _accuracy(digits.program, digits.x_test, digits.y_test)
    sparse, masks = prune_program(digits.program, **kwargs)
    layer = ProgramLayer(sparse)
    trainer = pj.Trainer(layer, decorate(optax.adam(1e-3), masks), progress=False)
    trainer.fit((digits.x_train, digits.y_train), epochs=3, batch_size=32)
    tuned = pj.to_static(trainer.current_model(), pj.InputSpec((None, 1, 8, 8)))
    assert _accuracy(tuned, digits.x_test, digits.y_test) >= base - 0.02
    density = sparsity(tuned)
    assert all(density[f"params.{name}"] <= (0.5 if "n" in kwargs else 0.25) for name in masks)
