"""Layer 1: launch Numba kernels on CuPy's current stream, without Numba's per-call dispatch.

A Numba launch (``kernel[grid, block](*args)``) types every argument, wraps
each CuPy array in a Numba device array and looks the overload up: about ten
times the host time of a CuPy RawKernel launch.  SGT runs a handful of
launches, so on small graphs that was most of its time.

:func:`launch` keeps Numba's kernels -- compiled by Numba, from the same
Python source the simulator runs -- and launches them the way CuPy launches
its own: the first call of an argument signature goes through Numba (which
compiles, checks the types and launches); the module Numba built for it
(its cubin) is then loaded once into CuPy, and later calls pass the
arguments flattened as Numba's calling convention lays them out (an array is
``meminfo, parent, size, itemsize, data, shape..., strides...``, see
``numba.cuda.dispatcher._Kernel._prepare_args``) straight to the driver
(:func:`.driver.launch`: one 8-byte slot per parameter).  An
argument the fast path does not know (not a CuPy array, an int or a float)
takes Numba's path every time, and so does every call in the simulator.

Every launch goes to CuPy's current stream, so Numba and CuPy work stays in
order, ``with cupy.cuda.Stream():`` covers both, and CUDA-graph capture sees
the Numba kernels too.

A signature Numba has compiled (on any device, or by a background compile)
is not launched through Numba again: each device's first launch loads
Numba's cubin into CuPy, so Numba's own module is loaded on one device at
most.  numba-cuda 0.30 keeps one library per cubin, loads it into each
device's context that launches the kernel, and unloads it at exit once per
context: the 2-GPU tests aborted at exit after passing (``free(): invalid
pointer``).
"""

import threading

import numpy as np

from .._device import patch_numpy_for_numba

patch_numpy_for_numba()  # before Numba compiles anything (numba-cuda 0.30 calls numpy.row_stack)
from numba import config, cuda  # noqa: E402

config.CUDA_LOW_OCCUPANCY_WARNINGS = 0  # (small graphs launch small grids by nature: every launch comes here)

from .driver import launch as driver_launch  # noqa: E402
from .driver import slot_value

__all__ = ["launch", "current_stream", "fast_path_count", "numba_gpus"]

_SIM = bool(config.ENABLE_CUDASIM)
_FAST = {}  # (dispatcher id, device, argument key) -> (dispatcher, CuPy function, packers)
_FIRST = threading.Lock()  # (a signature's first launch on a device: one thread at a time)
_STREAMS = {}  # CuPy stream pointer -> Numba stream object
_GPUS = threading.Lock()  # (Numba's device list: built by one thread)
_GPUS_BUILT = []
_NOT_FAST = object()
_CALLS = [0]
_ndarray = [None]  # cupy.ndarray, once CuPy is imported

#: NumPy scalar types Numba and CuPy pass the same way (by value, in the type's own width).
_SCALARS = frozenset(np.dtype(t) for t in (np.int32, np.int64, np.uint32, np.uint64, np.float32, np.float64))


def numba_gpus():
    """Numba's device list (``numba.cuda.gpus``), built under a lock on first use.  Numba builds it lazily and not
    thread-safely: two threads that first reach it at once both register device 0, and one of them raises.  The
    translation kernels' background compile reaches it on its own thread while the caller launches."""
    if not _GPUS_BUILT:
        with _GPUS:
            if not _GPUS_BUILT:
                len(cuda.gpus)  # (builds the list, and Numba's driver before it)
                _GPUS_BUILT.append(True)
    return cuda.gpus


def current_stream():
    """The Numba stream object of CuPy's current stream (cached per stream pointer; Numba's devices are reached
    through :func:`numba_gpus` first)."""
    import cupy

    ptr = cupy.cuda.get_current_stream().ptr
    s = _STREAMS.get(ptr)
    if s is None:
        numba_gpus()
        # 0 is the legacy default stream in CuPy and in Numba; 2 is CUDA's per-thread default stream.
        if ptr == 0:
            s = cuda.default_stream()
        elif ptr == 2:
            s = cuda.per_thread_default_stream()
        else:
            s = cuda.external_stream(ptr)
        _STREAMS[ptr] = s
    return s


def _arg_key(a):
    """A cheap key that fixes Numba's type of ``a``, or ``_NOT_FAST``.  A CuPy array's layout is read from the fields
    behind its ``flags`` (each ``flags`` access builds an object, and a launch keys every argument)."""
    t = type(a)
    if t is _ndarray[0]:
        return (a.dtype.char, a.ndim, a._c_contiguous, a._f_contiguous)
    if t is int:
        return int
    if t is float:
        return float
    if isinstance(a, np.generic):
        return a.dtype if a.dtype in _SCALARS else _NOT_FAST
    return _NOT_FAST


def _pack_array(a, out):
    out += (0, 0, a.size, a.itemsize, a.data.ptr)  # meminfo, parent, size, itemsize, data
    out += a.shape
    out += a.strides


def _pack_vector(a, out):
    """:func:`_pack_array` of a contiguous 1-D array, its shape and strides from its size and item size (CuPy builds
    both tuples on each access, and most arguments are such arrays)."""
    n, s = a.size, a.itemsize
    out += (0, 0, n, s, a.data.ptr, n, s)


def _packer(key):
    if key is int:
        return lambda a, out: out.append(a)
    if key is float or isinstance(key, np.dtype):
        return lambda a, out: out.append(slot_value(a))  # Python floats are doubles to Numba
    return _pack_vector if key[1] == 1 and key[2] else _pack_array


def launch(kernel, grid, block, *args):
    """``kernel[grid, block, stream](*args)`` on CuPy's current stream, dispatch cached per signature.

    Parameters
    ----------
    kernel : numba.cuda dispatcher
    grid, block : int or tuple
    *args : CuPy arrays (any layout), Python / NumPy integers and floats;
        NumPy arrays in the simulator.
    """
    if _SIM:
        kernel[grid, block](*args)
        return
    import cupy

    _ndarray[0] = cupy.ndarray
    keys = tuple(map(_arg_key, args))
    entry = None if _NOT_FAST in keys else _FAST.get((id(kernel), cupy.cuda.runtime.getDevice(), keys))
    if entry is None:
        if _NOT_FAST in keys:
            kernel[grid, block, current_stream()](*args)
            return
        entry = _first_launch(kernel, grid, block, keys, args)
        if entry is None:
            return
    _, function, packers = entry
    flat = []
    for pack, a in zip(packers, args):
        pack(a, flat)
    driver_launch(function.ptr, grid, block, flat, cupy.cuda.get_current_stream().ptr)
    _CALLS[0] += 1


def _first_launch(kernel, grid, block, keys, args):
    """A signature's first launch on the current device: the entry of the cubin Numba has built for it (on any
    device, or by a background compile), loaded into CuPy for the caller to launch; else Numba's launch -- which
    compiles, types and checks the arguments, and loads Numba's module on this device only -- and None.  One
    thread at a time, so that two devices' threads do not both take Numba's launch; Numba's devices reached through
    :func:`numba_gpus` first."""
    import cupy

    numba_gpus()
    device = cupy.cuda.runtime.getDevice()
    cc = cupy.cuda.Device(device).compute_capability
    cc = (int(cc[:-1]), int(cc[-1]))
    cc += ("a" if cc >= (9, 0) else "",)  # (the key of Numba's own cubin for this device: another one links anew)
    with _FIRST:
        entry = _FAST.get((id(kernel), device, keys))  # (another thread's, meanwhile)
        if entry is None:
            image = _image(kernel, args, cc)
            entry = None if image is None else _load(kernel, device, keys, *image)
        if entry is not None:
            return entry
        kernel[grid, block, current_stream()](*args)
        image = _image(kernel, args, cc)
        if image is not None:
            _load(kernel, device, keys, *image)
    return None


def _image(kernel, args, cc):
    """``(cubin, entry name)`` for compute capability ``cc`` of the overload Numba has compiled for these
    arguments' signature; None where it has none yet, or its module has state Numba sets up (or Numba's internals
    are not as expected)."""
    try:
        argtypes = tuple(kernel.typeof_pyval(a) for a in args)
        overload = kernel.overloads.get(argtypes)
        if overload is None or overload.debug or overload.cooperative or overload.extensions:
            return None
        library = overload._codelibrary
        if library._setup_functions or library.needs_cudadevrt:  # module state Numba would set up
            return None
        image = library.get_cubin(cc=cc)
        return bytes(getattr(image, "code", image)), library._entry_name  # (numba-cuda 0.30: a cuda.core ObjectCode)
    except Exception:  # noqa: BLE001  another numba-cuda: keep its own launch path (tests check this one)
        return None


def _load(kernel, device, keys, cubin, name):
    """The cubin loaded into CuPy on ``device`` (current), kept as this signature's entry there; None where CuPy
    cannot load it (Numba's launch serves then)."""
    import cupy

    try:
        module = cupy.cuda.function.Module()
        module.load(cubin)
        function = module.get_function(name)
    except Exception:  # noqa: BLE001
        return None
    # The dispatcher stays referenced by its entry: the key holds its id.
    entry = _FAST[(id(kernel), device, keys)] = (kernel, function, tuple(_packer(k) for k in keys))
    return entry


def fast_path_count():
    """Launches that took the cached path so far (tests check it is used)."""
    return _CALLS[0]
