"""Importers: models from other frameworks' files as programs, so that every pass, compression
strategy, the Predictor and the hub apply to them.

- :func:`from_onnx`: an ONNX model (opsets 7 to 21; the ``onnx`` package reads the protobuf);
- :func:`from_paddle`: a PaddlePaddle inference model, legacy ``.pdmodel`` or PIR ``.json``, with
  its ``.pdiparams`` (read with Paddle's public protobuf schema and the tensor stream's layout);
- :func:`from_keras`: a Keras 2 ``.h5`` model (``h5py`` reads it; JSON config, HDF5 weights);

and one exporter:

- :func:`to_onnx`: a program as an ONNX model (registry ops to their ONNX twins, parameters as
  initializers under their names, symbolic sizes as ``dim_param`` s).

Each importer maps the source's ops to the op library (``Conv`` becomes ``conv2d``,
``BatchNormalization`` ``batch_norm``), keeps the source's weight names as parameter names, and
raises :class:`ConversionError` naming every op and node it cannot convert.

>>> import paddlejax as pj
>>> callable(pj.convert.from_onnx)
True
"""
from paddlejax.convert.errors import ConversionError
from paddlejax.convert.keras_import import from_keras
from paddlejax.convert.onnx_export import to_onnx
from paddlejax.convert.onnx_import import from_onnx
from paddlejax.convert.paddle_import import from_paddle

__all__ = ["ConversionError", "from_keras", "from_onnx", "from_paddle", "to_onnx"]
