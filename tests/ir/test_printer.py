"""The text form is stable and readable; tests compare it verbatim."""
import jax
import jax.numpy as jnp

import paddlejax as pj


def test_print_ops_params_and_attributes():
    def f(p, x):
        y = pj.ops.conv2d(x, p["w"], stride=2, padding="SAME")
        return pj.ops.relu(y) * 2.0

    prog = pj.trace(f, pj.InputSpec((None, 1, 4, 4), name="image"), params={"w": jnp.ones((2, 1, 3, 3))})
    assert str(prog) == """\
program @f(%image: f32[b,1,4,4]) -> (f32[b,2,2,2]) {
  %0 = param @w : f32[2,1,3,3]
  %1 = conv2d(%image, %0) {stride=(2, 2), padding="SAME", dilation=(1, 1), groups=1, data_format="NCHW"} : f32[b,2,2,2]
  %2 = relu(%1) : f32[b,2,2,2]
  %3 = constant 2.0 : f32[]
  %4 = lax.mul(%2, %3) : f32[b,2,2,2]
  return %4
}"""


def test_print_control_flow_blocks():
    def f(x):
        return jax.lax.cond(x.sum() > 0, lambda a: a + 1.0, lambda a: -a, x)

    assert str(pj.trace(f, jnp.ones(2))) == """\
program @f(%x: f32[2]) -> (f32[2]) {
  %0 = lax.reduce_sum(%x) {axes=(0,)} : f32[]
  %1 = constant 0.0 : f32[]
  %2 = lax.gt(%0, %1) : bool[]
  %3 = lax.convert_element_type(%2) {new_dtype=int32, weak_type=False} : i32[]
  %4 = cond(%3, %x) : f32[2] (
    branch0(%5: f32[2]) {
      %6 = lax.neg(%5) : f32[2]
      return %6
    }
    branch1(%7: f32[2]) {
      %8 = constant 1.0 : f32[]
      %9 = lax.add(%7, %8) : f32[2]
      return %9
    }
  )
  return %4
}"""


def test_locs_are_shown_on_request():
    prog = pj.trace(lambda x: pj.ops.relu(x), jnp.ones(2))
    line = prog.format(locs=True).splitlines()[1]
    assert line.startswith("  %0 = relu(%x) : f32[2]  # ") and "test_printer.py:" in line
