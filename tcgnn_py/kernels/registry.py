"""Layer 1: the compile registry of the CuPy RawModule kernel families.

One RawModule per family, compiled once per process and device (CuPy also
caches the binary on disk), with name expressions generated from one table of
template arguments.  The library's families live in :mod:`.products`,
:mod:`.nn` and :mod:`.timing`; packages above may :func:`register` their own (the benchmarks'
baseline SDDMM does).  CI compiles every family of :func:`families` through
NVRTC directly, without a GPU (``tests/test_nvrtc.py``).
"""

import functools

__all__ = ["OPTIONS", "VALUE_TYPES", "families", "register", "get_kernel"]

#: NVRTC options shared by every family (CuPy adds the target architecture).
OPTIONS = ("--std=c++17",)

#: NumPy value type name -> CUDA C++ type, for every family's template arguments.
VALUE_TYPES = {"float32": "float", "float64": "double"}

_EXTRA = {}


def register(family, source, names):
    """Add a family from a package above layer 1 (same compile path and CI check)."""
    known = _library_families()
    if family in known or _EXTRA.get(family, (source, tuple(names))) != (source, tuple(names)):
        raise ValueError(f"kernel family {family!r} is already registered")
    _EXTRA[family] = (source, tuple(names))


@functools.cache
def _library_families():
    from . import nn, products, timing

    return {**products.FAMILIES, **nn.FAMILIES, **timing.FAMILIES}


def families():
    """``family -> (CUDA source, name expressions)`` of every registered family."""
    return {**_library_families(), **_EXTRA}


@functools.cache
def _module(family, device_id):
    import cupy

    code, names = families()[family]
    with cupy.cuda.Device(device_id):
        return cupy.RawModule(code=code, options=OPTIONS, name_expressions=names)


@functools.cache
def _kernel(family, name, device_id):
    return _module(family, device_id).get_function(name)


def get_kernel(family, name):
    """The compiled kernel ``name`` of ``family`` on the current device (compiled once)."""
    import cupy

    return _kernel(family, name, cupy.cuda.runtime.getDevice())


def compile_count():
    """How many modules were compiled so far in this process (tests check the cache)."""
    return _module.cache_info().misses
