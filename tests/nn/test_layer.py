"""The Layer base class and containers: modes reach every sub-module, parameters are named by
path as in Paddle, and a model trains with nnx.Optimizer under nnx.jit."""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import paddlejax.nn as nn


class Block(nn.Layer):
    """A user-defined layer mixing our layers with plain nnx modules."""

    def __init__(self):
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.5)
        self.nnx_drop = nnx.Dropout(0.5, rngs=nnx.Rngs(0))
        self.nnx_bn = nnx.BatchNorm(4, rngs=nnx.Rngs(0))

    def forward(self, x):
        return self.nnx_bn(self.nnx_drop(self.drop(self.fc(x))))


def test_layers_start_in_training_and_modes_reach_nested_and_plain_nnx_modules():
    model = nn.Sequential(Block(), nn.LayerList([Block()]))
    inner = model[1][0]
    assert model.training and inner.drop.training
    model.eval()
    assert not model.training and not inner.drop.training and not inner.fc.training
    assert inner.nnx_drop.deterministic and inner.nnx_bn.use_running_average
    model.train()
    assert inner.drop.training and not inner.nnx_drop.deterministic and not inner.nnx_bn.use_running_average


def test_calling_a_layer_calls_forward_with_its_signature():
    class Scale(nn.Layer):
        def forward(self, x, factor=2.0):
            return x * factor

    assert Scale()(3.0, factor=4.0) == 12.0
    assert list(inspect.signature(Scale().__call__).parameters) == ["x", "factor"]
    with pytest.raises(NotImplementedError, match="Layer defines no forward"):
        nn.Layer()(1.0)


def test_sequential_applies_in_order_indexes_slices_and_names_parameters():
    nn.seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    w0, b0, w2, b2 = (np.asarray(getattr(model[i], n)[...]) for i, n in
                      ((0, "weight"), (0, "bias"), (2, "weight"), (2, "bias")))
    np.testing.assert_allclose(model(x), np.maximum(x @ w0 + b0, 0) @ w2 + b2, rtol=1e-5, atol=1e-6)
    assert len(model) == 3 and isinstance(model[-1], nn.Linear) and len(model[1:]) == 2
    assert [n for n, _ in model.named_parameters()] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    with pytest.raises(IndexError, match="index 3 out of range for 3 layers"):
        model[3]


def test_sequential_of_named_pairs_and_bad_entries():
    model = nn.Sequential(("encoder", nn.Linear(2, 3)), ("act", nn.Tanh()))
    assert isinstance(model["encoder"], nn.Linear) and isinstance(model[1], nn.Tanh)
    assert [n for n, _ in model.named_parameters()] == ["encoder.bias", "encoder.weight"]
    with pytest.raises(ValueError, match=r"Sequential: argument 'layers\[1\]' expects a layer"):
        nn.Sequential(nn.ReLU(), 3)


def test_layer_list_is_a_mutable_list_of_layers():
    layers = nn.LayerList([nn.Linear(2, 2), nn.Linear(2, 2)])
    layers.append(nn.Linear(2, 3))
    layers.insert(0, nn.ReLU())
    assert len(layers) == 4 and isinstance(layers[0], nn.ReLU) and layers[3].weight[...].shape == (2, 3)
    assert [n for n, _ in layers.named_parameters()][-2:] == ["3.bias", "3.weight"]


def test_parameters_include_frozen_ones_and_create_parameter_follows_attrs():
    layer = nn.Linear(2, 3, bias_attr=nn.ParamAttr(trainable=False))
    assert [type(p).__name__ for p in layer.parameters()] == ["FrozenParam", "Param"]
    layer.extra = layer.create_parameter((2,), nn.initializer.Constant(3.0))
    assert layer.extra[...].tolist() == [3.0, 3.0]
    assert layer.create_parameter((2,), attr=False) is None
    with pytest.raises(TypeError, match="Linear: argument 'attr' expects None, False, an Initializer"):
        layer.create_parameter((2,), attr=3)


def test_a_model_trains_with_nnx_optimizer_under_jit():
    nn.seed(1)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = nnx.Optimizer(model, optax.adam(0.05), wrt=nnx.Param)
    x = np.random.default_rng(1).normal(size=(16, 3)).astype(np.float32)
    y = x.sum(1, keepdims=True)

    @nnx.jit
    def step(model, optimizer):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    losses = [float(step(model, optimizer)) for _ in range(30)]
    assert losses[-1] < 0.1 * losses[0]
    assert jax.tree.leaves(nnx.state(model, nnx.Param))  # parameters stayed arrays


def test_parameter_list_holds_parameters_named_by_position(round_trip):
    class Scales(nn.Layer):
        def __init__(self):
            self.scales = nn.ParameterList([self.create_parameter((3,), default_initializer=nn.initializer.Constant(c))
                                            for c in (1.0, 2.0)])

        def forward(self, x):
            for p in self.scales:
                x = x * p[...]
            return x

    model = Scales()
    model.scales.append(model.create_parameter((3,), default_initializer=nn.initializer.Constant(0.5)))
    assert [n for n, _ in model.named_parameters()] == ["scales.0", "scales.1", "scales.2"]
    assert model(jnp.ones(3)).tolist() == [1.0, 1.0, 1.0]
    grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones(3))))(model)
    assert grads["scales"][1][...].tolist() == [0.5, 0.5, 0.5]
    assert "@scales.2" in round_trip(model, np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"ParameterList: argument 'parameters\[0\]' expects a parameter"):
        nn.ParameterList([jnp.ones(2)])
    # a plain array added later would be held but never trained: refused however it comes in
    for add in (lambda s: s.append(jnp.ones(3)), lambda s: s.insert(0, jnp.ones(3)),
                lambda s: s.extend([jnp.ones(3)]), lambda s: s.__setitem__(0, jnp.ones(3)),
                lambda s: s.__setitem__(slice(0, 1), [jnp.ones(3)])):
        with pytest.raises(ValueError, match=r"ParameterList: argument 'value' expects a parameter \(nnx.Param\), "
                                             r"got 'ArrayImpl'"):
            add(model.scales)
    assert [n for n, _ in model.named_parameters()] == ["scales.0", "scales.1", "scales.2"]
    model.scales[0] = model.create_parameter((3,))
    model.scales.insert(1, model.create_parameter((3,)))
    assert len(jax.tree.leaves(nnx.state(model, nnx.Param))) == 4
