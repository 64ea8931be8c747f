"""The one error importers raise for a model they cannot convert."""


class ConversionError(ValueError):
    """A model file an importer cannot read or convert; the message names the node and op.

    >>> raise ConversionError("node 'conv_3' (Conv): unsupported auto_pad 'BAD'")
    Traceback (most recent call last):
        ...
    paddlejax.convert.errors.ConversionError: node 'conv_3' (Conv): unsupported auto_pad 'BAD'
    """
