"""The compiled part of paddlejax: oneDNN kernels called from XLA through FFI custom calls
(``paddlejax/ops/onednn.cc``; see ``paddlejax/ops/onednn.py``). Everything else is in
pyproject.toml.

The build finds oneDNN's headers and library in the ``onednn-devel-cpu-gomp`` wheel and XLA's
FFI headers in ``jaxlib`` (both build requirements). The extension is optional: where it cannot
be built the install goes on, and paddlejax runs XLA's own kernels.
"""
import hashlib
import importlib.metadata
import platform
from pathlib import Path

from setuptools import Extension, setup


def _dist_dir(dist: str, suffix: str) -> str:
    """The folder of the file of distribution ``dist`` whose path ends with ``suffix``."""
    for file in importlib.metadata.distribution(dist).files or ():
        if str(file).endswith(suffix):
            return str(Path(file.locate()).resolve().parent)
    raise FileNotFoundError(f"{dist} has no {suffix}")


def _extensions() -> list[Extension]:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return []
    try:
        import jaxlib

        include = [str(Path(jaxlib.__file__).parent / "include"),
                   str(Path(_dist_dir("onednn-devel-cpu-gomp", "oneapi/dnnl/dnnl.hpp")).parents[1])]
        lib = _dist_dir("onednn-cpu-gomp", "/libdnnl.so.3")
    except (ImportError, importlib.metadata.PackageNotFoundError, FileNotFoundError) as e:
        print(f"paddlejax: building without the oneDNN kernels ({e})")
        return []
    source = "paddlejax/ops/onednn.cc"
    # the library says which source it was built from, so that a stale build is not taken for
    # a fresh one (the optional build leaves the last library in place when a compile fails)
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()
    return [Extension("paddlejax.ops._onednn", [source], language="c++",
                      define_macros=[("PADDLEJAX_ONEDNN_SOURCE_SHA256", f'"{digest}"')],
                      include_dirs=include, library_dirs=[lib], libraries=[":libdnnl.so.3"],
                      # site-packages/paddlejax/ops -> the environment's lib, where the wheel puts libdnnl
                      runtime_library_dirs=["$ORIGIN/../../../.."],
                      extra_compile_args=["-std=c++17", "-O2"], optional=True)]


setup(ext_modules=_extensions())
