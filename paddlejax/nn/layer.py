"""The layer base class and the containers: :class:`Layer`, :class:`Sequential`, :class:`LayerList`,
:class:`ParameterList`.

Layers are ``flax.nnx`` modules written the Paddle way: they start in training mode, define
``forward``, create parameters with :meth:`Layer.create_parameter` and switch modes with
``train()`` / ``eval()``, which also reach plain nnx sub-modules (``nnx.Dropout``,
``nnx.BatchNorm``) through their ``deterministic`` / ``use_running_average`` flags.

>>> import jax.numpy as jnp, paddlejax.nn as nn
>>> class MLP(nn.Layer):
...     def __init__(self):
...         self.fc = nn.Linear(4, 2)
...         self.drop = nn.Dropout(0.5)
...     def forward(self, x):
...         return self.drop(self.fc(x))
>>> model = MLP()
>>> model.training, model.drop.training
(True, True)
>>> model.eval()
>>> model.drop.training, model(jnp.ones((3, 4))).shape
(False, (3, 2))
>>> [name for name, _ in model.named_parameters()]
['fc.bias', 'fc.weight']
"""
from __future__ import annotations

from flax import nnx

from paddlejax.nn import initializer
from paddlejax.nn.args import arg_error, is_int

_PARAMS = (nnx.Param, initializer.FrozenParam)


class Layer(nnx.Module):
    """Base class of all layers (Paddle's ``paddle.nn.Layer``) on ``nnx.Module``.

    Calling a layer calls its ``forward``. ``training`` starts True; :meth:`train` and
    :meth:`eval` set it on every sub-layer.

    >>> class Double(Layer):
    ...     def forward(self, x):
    ...         return 2 * x
    >>> Double()(3)
    6
    """

    training = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # calling a layer is calling its forward; aliasing (rather than a forwarding
        # __call__) costs nothing per call and keeps forward's signature visible
        if "forward" in vars(cls) and "__call__" not in vars(cls):
            cls.__call__ = cls.forward

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} defines no forward()")

    def train(self, **attributes) -> None:
        """Training mode for this layer and every sub-module (dropout on, batch statistics)."""
        self.set_attributes(training=True, deterministic=False, use_running_average=False, **attributes,
                            raise_if_not_found=False)

    def eval(self, **attributes) -> None:
        """Inference mode for this layer and every sub-module (dropout off, running statistics)."""
        self.set_attributes(training=False, deterministic=True, use_running_average=True, **attributes,
                            raise_if_not_found=False)

    def create_parameter(self, shape, attr=None, dtype="float32", is_bias=False, default_initializer=None, *,
                         rngs: nnx.Rngs | None = None, arg: str = "attr"):
        """A new parameter (see :func:`paddlejax.nn.initializer.create_parameter`); assign it
        to an attribute. Returns None when ``attr is False``; ``arg`` names ``attr`` in errors.

        >>> layer = Layer()
        >>> layer.scale = layer.create_parameter((3,), default_initializer=initializer.Constant(1.0))
        >>> layer.scale[...].tolist()
        [1.0, 1.0, 1.0]
        """
        return initializer.create_parameter(shape, attr, dtype, is_bias, default_initializer, rngs=rngs,
                                            layer=type(self).__name__, arg=arg)

    def named_parameters(self) -> list[tuple[str, nnx.Variable]]:
        """``(dotted path, variable)`` of every parameter, trainable or frozen, sorted by path."""
        return [(".".join(str(p) for p in path), node) for path, node in nnx.iter_graph(self)
                if isinstance(node, _PARAMS)]

    def parameters(self) -> list[nnx.Variable]:
        """Every parameter variable (see :meth:`named_parameters`)."""
        return [v for _, v in self.named_parameters()]


class LayerList(Layer, nnx.List):
    """A list of layers (Paddle's ``LayerList``): indexable, iterable, ``append`` / ``insert`` /
    ``extend``. Parameters are named by position (``0.weight``).

    >>> import paddlejax.nn as nn
    >>> layers = LayerList([nn.Linear(2, 2) for _ in range(3)])
    >>> len(layers), type(layers[-1]).__name__
    (3, 'Linear')
    >>> layers.append(nn.ReLU()); len(layers)
    4
    """

    def __init__(self, sublayers=None):
        nnx.List.__init__(self, sublayers)


class ParameterList(Layer, nnx.List):
    """A list of parameters (Paddle's ``ParameterList``), named by position (``0``, ``1``, ...):
    indexable, iterable, ``append``. Holds ``nnx.Param`` s, such as those
    :meth:`Layer.create_parameter` returns.

    >>> import jax.numpy as jnp
    >>> from paddlejax.nn.initializer import Constant
    >>> layer = Layer()
    >>> params = ParameterList([layer.create_parameter((2,), default_initializer=Constant(1.0)) for _ in range(2)])
    >>> params.append(layer.create_parameter((3,)))
    >>> len(params), [name for name, _ in params.named_parameters()], params[2][...].shape
    (3, ['0', '1', '2'], (3,))

    Anything else (a plain array would be held but never trained) is refused, however it is added:

    >>> params.append(jnp.ones(3))
    Traceback (most recent call last):
    ...
    ValueError: ParameterList: argument 'value' expects a parameter (nnx.Param), got 'ArrayImpl'
    """

    def __init__(self, parameters=None):
        parameters = list(parameters or [])
        for i, p in enumerate(parameters):
            _check_param(f"parameters[{i}]", p)
        nnx.List.__init__(self, parameters)

    def append(self, value) -> None:
        nnx.List.append(self, _check_param("value", value))

    def insert(self, index, value) -> None:
        nnx.List.insert(self, index, _check_param("value", value))

    def __setitem__(self, index, value) -> None:
        if isinstance(index, slice):
            value = [_check_param("value", v) for v in value]
        else:
            _check_param("value", value)
        nnx.List.__setitem__(self, index, value)


def _check_param(name, value):
    if not isinstance(value, _PARAMS):
        raise arg_error("ParameterList", name, "a parameter (nnx.Param)", type(value).__name__)
    return value


class Sequential(Layer):
    """Layers applied in order (Paddle's ``Sequential``). Takes layers, or ``(name, layer)``
    pairs that name them; parameters are named ``0.weight`` (or ``name.weight``).

    >>> import jax.numpy as jnp, paddlejax.nn as nn
    >>> model = Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> model(jnp.ones((1, 4))).shape, len(model), type(model[1]).__name__
    ((1, 2), 3, 'ReLU')
    >>> named = Sequential(("fc", nn.Linear(4, 2)), ("act", nn.Tanh()))
    >>> [name for name, _ in named.named_parameters()]
    ['fc.bias', 'fc.weight']
    """

    def __init__(self, *layers):
        named = layers and all(isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                               for item in layers)
        pairs = layers if named else [(str(i), layer) for i, layer in enumerate(layers)]
        for i, (name, layer) in enumerate(pairs):
            if not callable(layer):
                raise arg_error("Sequential", f"layers[{i}]", "a layer (or a (name, layer) pair)", layer)
            setattr(self, name, layer)
        self._names = tuple(name for name, _ in pairs)

    def __len__(self) -> int:
        return len(self._names)

    def __iter__(self):
        return (getattr(self, name) for name in self._names)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Sequential(*[(name, getattr(self, name)) for name in self._names[index]])
        if isinstance(index, str):
            return getattr(self, index)
        if not is_int(index) or not -len(self) <= index < len(self):
            raise IndexError(f"Sequential: index {index!r} out of range for {len(self)} layers")
        return getattr(self, self._names[index])

    def forward(self, x):
        for name in self._names:
            x = getattr(self, name)(x)
        return x
