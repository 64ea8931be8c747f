"""fuse_conv_pool: pool2d(conv2d(...)) becomes one conv2d_pool where the convolution's output is
read by the pool alone; the inference pipeline runs it, quantization never sees it."""
import jax.numpy as jnp
import numpy as np
import pytest

import paddlejax as pj
from paddlejax.convert import ConversionError
from paddlejax.inference import Config, Predictor

rng = np.random.default_rng(0)
W = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
B = rng.standard_normal(4).astype(np.float32)


def conv_pool(fmt="NCHW", pool_fmt=None, **pool):
    def net(p, x):
        y = pj.ops.conv2d(x, p["w"], p["b"], padding=1, act="relu", data_format=fmt)
        return pj.ops.pool2d(y, data_format=pool_fmt or fmt, **{"kernel_size": 2, **pool})
    shape = (2, 3, 6, 6) if fmt == "NCHW" else (2, 6, 6, 3)
    return pj.trace(net, jnp.ones(shape), params={"w": W, "b": B})


def types(prog):
    return [op.type for op in prog.walk() if op.type not in ("param", "return")]


def test_a_pool_after_a_conv_becomes_conv2d_pool():
    prog = conv_pool(pooling_type="avg", stride=2, padding=1, ceil_mode=True, exclusive=False)
    assert str(prog).splitlines()[3:5] == [
        '  %2 = conv2d(%x, %1, %0) {stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, '
        'data_format="NCHW", act="relu"} : f32[2,4,6,6]',
        '  %3 = pool2d(%2) {pooling_type="avg", kernel_size=(2, 2), stride=(2, 2), padding=((1, 1), (1, 1)), '
        'ceil_mode=True, global_pooling=False, exclusive=False, data_format="NCHW"} : f32[2,4,4,4]']
    fused = pj.passes.run(prog, "fuse_conv_pool")
    assert str(fused).splitlines()[3] == (
        '  %2 = conv2d_pool(%x, %1, %0) {stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=1, '
        'data_format="NCHW", act="relu", pooling_type="avg", pool_size=(2, 2), pool_stride=(2, 2), '
        'pool_padding=((1, 1), (1, 1)), ceil_mode=True, exclusive=False} : f32[2,4,4,4]')
    assert types(fused) == ["conv2d_pool"]
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(fused(x), prog(x), rtol=1e-6, atol=1e-6)


def test_a_kernel_the_conv_carried_is_dropped():
    prog = conv_pool("NHWC")
    for op in prog.walk():
        if op.type == "conv2d":
            op.attrs["kernel"] = "im2col"
    (fused,) = [op for op in pj.passes.run(prog, "fuse_conv_pool").walk() if op.type == "conv2d_pool"]
    assert "kernel" not in fused.attrs and fused.attrs["data_format"] == "NHWC"


def test_what_does_not_fuse():
    def shared(p, x):  # the conv's output has another reader
        y = pj.ops.conv2d(x, p["w"])
        return pj.ops.pool2d(y, kernel_size=2), y

    def depthwise(p, x):
        return pj.ops.pool2d(pj.ops.depthwise_conv2d(x, p["dw"]), kernel_size=2)

    x = jnp.ones((1, 3, 6, 6))
    params = {"w": W, "dw": rng.standard_normal((3, 1, 3, 3)).astype(np.float32)}
    for prog in (pj.trace(shared, x, params=params), pj.trace(depthwise, x, params=params),
                 conv_pool("NHWC", pool_fmt="NCHW"), conv_pool(global_pooling=True)):
        assert str(pj.passes.run(prog, "fuse_conv_pool")) == str(prog)


def test_the_inference_pipeline_runs_it_after_the_activation_fusions():
    pipeline = pj.passes.INFERENCE_PIPELINE
    assert pipeline.index("fuse_conv_pool") == pipeline.index("fuse_elementwise_act") + 1
    assert "fuse_conv_pool" in pj.passes.inference_pipeline()


def test_quantization_still_sees_plain_convolutions():
    prog = conv_pool()
    calib = [rng.standard_normal((2, 3, 6, 6)).astype(np.float32)]
    int8 = pj.slim.quant_post(prog, calib, progress=False)
    assert "quantized_conv2d" in types(int8) and "conv2d_pool" not in types(int8)
    # and the inference passes after it leave the int8 convolution and its pool alone
    assert types(pj.passes.run(int8, "fuse_bias_act,fuse_conv_pool,int8_dataflow,dce")) == \
        ["quantize", "quantized_conv2d", "pool2d"]


def test_int8_dataflow_passes_a_fused_op_by():
    fused = pj.passes.run(conv_pool(), "fuse_conv_pool")
    assert types(pj.passes.run(fused, "int8_dataflow")) == ["conv2d_pool"]


def test_the_onnx_exporter_names_the_op_it_cannot_export():
    fused = pj.passes.run(conv_pool(), "fuse_conv_pool")
    with pytest.raises(ConversionError, match="conv2d_pool: no ONNX exporter"):
        pj.convert.to_onnx(fused)


def test_a_predictor_of_a_conv_bn_relu_pool_model(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLEJAX_AUTOTUNE_CACHE", str(tmp_path / "tune.json"))
    model = pj.nn.Sequential(pj.nn.Conv2D(3, 8, 3, padding=1), pj.nn.BatchNorm2D(8), pj.nn.ReLU(),
                             pj.nn.MaxPool2D(2), pj.nn.Conv2D(8, 4, 3), pj.nn.AvgPool2D(2, ceil_mode=True))
    x = rng.standard_normal((3, 3, 10, 10)).astype(np.float32)
    model.train()
    model(x)  # running statistics that are not the initial ones
    model.eval()
    predictor = Predictor(pj.to_static(model, pj.InputSpec((None, 3, 10, 10))), Config(max_batch_size=4))
    assert types(predictor.program).count("conv2d_pool") == 2
    np.testing.assert_allclose(predictor.run(x), np.asarray(model(x)), rtol=1e-4, atol=1e-4)
