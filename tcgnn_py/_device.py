"""Layer 0: where arrays live, and lazy access to the GPU stack.

``import tcgnn_py`` must work on a machine without CuPy, Numba or a GPU, so
nothing here imports them at module level.  :func:`gpu_available` decides once
per process whether the GPU path is usable; everything else asks it.
"""

import contextlib
import functools
import importlib.util
import math
import os
import sys
import threading
import warnings

import numpy as np

__all__ = [
    "zeroed_apart",
    "zeros",
    "scratch_views",
    "NoGPUWarning",
    "FallbackWarning",
    "DeviceMismatchError",
    "DEVICES",
    "use_gpu",
    "gpu_available",
    "gpu_unusable_reason",
    "get_cupy",
    "device_attributes",
    "array_module",
    "is_device_array",
    "publish",
    "to_host",
]

#: Set ``TCGNN_PY_DEVICE=cpu`` to force the NumPy reference path on a GPU machine.
_ENV_DEVICE = "TCGNN_PY_DEVICE"


class NoGPUWarning(RuntimeWarning):
    """Raised once per process when tcgnn_py falls back to the NumPy reference path."""


class FallbackWarning(RuntimeWarning):
    """A fast path that was asked for cannot take these inputs, so a slower one computes the same function; the
    message says why (e.g. ``graph_attention(fused=True)`` on float64 features runs the reference)."""


class DeviceMismatchError(TypeError):
    """Device (GPU) data met a path that runs on the host, or host data a path that needs the GPU."""


#: What every ``device=`` argument accepts: ``None`` (the GPU when usable), ``"cuda"`` or ``"cpu"``.
DEVICES = (None, "cuda", "cpu")


def use_gpu(device):
    """Whether to run on the GPU for a ``device=`` argument (see :data:`DEVICES`).

    ``"cuda"`` where the GPU path is not usable raises ``RuntimeError`` with the
    reason; ``None`` without a GPU warns once (:class:`NoGPUWarning`).
    """
    if not (device is None or isinstance(device, str)) or device not in DEVICES:
        raise ValueError(f"device must be None, 'cuda' or 'cpu', got {device!r}")
    if device == "cpu":
        return False
    ok, reason = _probe()
    if device == "cuda" and not ok:
        raise RuntimeError(f"device='cuda' asked for, but the GPU path is not usable: {reason}")
    if not ok:
        warn_no_gpu()
    return ok


def patch_numpy_for_numba():
    # numba-cuda 0.30 calls numpy.row_stack, which NumPy 2.5 removed
    # (numba-cuda #907, not to be fixed upstream).  The alias is exact.
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack


@functools.cache
def _probe():
    """Return ``(ok, reason)``: can CuPy and Numba both drive a CUDA GPU here?"""
    if os.environ.get(_ENV_DEVICE, "").lower() == "cpu":
        return False, f"{_ENV_DEVICE}=cpu"
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False, "NUMBA_ENABLE_CUDASIM=1 (simulator processes run the reference path)"
    try:
        import cupy
    except ImportError:
        return False, "CuPy is not installed (on a machine with an NVIDIA GPU: pip install 'tcgnn_py[cuda13]')"
    try:
        if not cupy.cuda.is_available():
            return False, "no CUDA device is visible to CuPy"
    except Exception as exc:  # driver missing or broken
        return False, f"CUDA is not usable: {exc}"
    if not _numba_cuda_found():
        return False, "Numba is not installed (on a machine with an NVIDIA GPU: pip install 'tcgnn_py[cuda13]')"
    return True, ""


def _numba_cuda_found():
    """Whether Numba and its CUDA target are installed, found without importing either: importing Numba costs
    ~0.3 s, and a process whose graphs are small (translated on the host) may never launch a Numba kernel
    (numba_launch imports it then).  ``find_spec("numba.cuda")`` would import the parent package, so the target
    is looked for as the numba-cuda package, or as the one in Numba's own tree."""
    numba = importlib.util.find_spec("numba")
    if numba is None:
        return False
    if importlib.util.find_spec("numba_cuda") is not None:
        return True
    return any(os.path.isdir(os.path.join(p, "cuda")) for p in numba.submodule_search_locations or ())


def gpu_unusable_reason():
    """Why the GPU path is not usable here (``""`` when it is)."""
    return _probe()[1]


def gpu_available():
    """Return True when the GPU path (CuPy + Numba CUDA) is usable.

    Examples
    --------
    >>> import tcgnn_py as tg
    >>> isinstance(tg.gpu_available(), bool)
    True
    """
    return _probe()[0]


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _user_stacklevel():
    """``stacklevel`` of the first caller outside tcgnn_py, so a warning points at the user's line."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
        frame, level = frame.f_back, level + 1
    return level


@functools.cache
def warn_no_gpu():
    """Warn, once per process, that the reference path is in use (at the user's line)."""
    warnings.warn(
        f"tcgnn_py: no usable GPU ({_probe()[1]}); using the NumPy reference path. "
        "Results are exact but slow.",
        NoGPUWarning,
        stacklevel=_user_stacklevel(),
    )


def get_cupy():
    """Import CuPy, with a clear error when the GPU path is not usable."""
    ok, reason = _probe()
    if not ok:
        raise RuntimeError(f"tcgnn_py: the GPU path is not available: {reason}")
    import cupy

    return cupy


def device_attributes():
    """The current device's attributes (CuPy's ``Device.attributes``), read once per device: that call asks the
    driver for every attribute, and a new matrix's first product (its multiprocessor count) would pay it each time.
    Read-only."""
    return _device_attributes(get_cupy().cuda.runtime.getDevice())


@functools.cache
def _device_attributes(device):
    return get_cupy().cuda.Device(device).attributes


def publish(value=None):
    """Finish the current stream's work before ``value`` (device data it just computed) is shared.

    Derived arrays cached on a matrix (work plans, masks, value casts,
    transposes) serve later calls on any stream, and a stream does not wait
    for another: the stream that computed them finishes first, once per cache
    entry.  Under CUDA-graph capture nothing may synchronize; the graph orders
    its own work.
    """
    stream = get_cupy().cuda.get_current_stream()
    if not stream.is_capturing():
        stream.synchronize()  # synchronize!
    return value


_ZEROED_APART = threading.local()


@contextlib.contextmanager
def zeroed_apart(stream):
    """While a call is recorded into a graph that is later updated in place by a new recording (XLA's command
    buffers), buffers that must start at zero (:func:`zeros`) are zeroed on ``stream`` (a CuPy stream that is not
    capturing), waited for: a memset node in a call's first recording alone would change the graph's shape, and
    an in-place update takes only recordings of one shape.  The thread must be allowed to wait (relaxed capture
    mode)."""
    before = getattr(_ZEROED_APART, "stream", None)
    _ZEROED_APART.stream = stream
    try:
        yield
    finally:
        _ZEROED_APART.stream = before


def zeros(shape, dtype):
    """``cupy.zeros``, or zeroed apart where :func:`zeroed_apart` is in effect (on this thread)."""
    cp = get_cupy()
    stream = getattr(_ZEROED_APART, "stream", None)
    if stream is None:
        return cp.zeros(shape, dtype)
    buf = cp.empty(shape, dtype)
    with stream:
        buf.fill(0)
    stream.synchronize()  # synchronize! (the side stream only: what is recorded next reads zeros)
    return buf


def scratch_views(xp, shapes, dtype=np.int32, align=1):
    """C-contiguous views of one new ``xp`` buffer, consecutive, of ``shapes`` each (an int: that many elements): a
    one-launch kernel's arrays in one allocation (each allocation is a call of its own on the host), each starting
    at a multiple of ``align`` elements."""
    shapes = [tuple(s) if isinstance(s, (tuple, list)) else (int(s),) for s in shapes]
    starts, at = [], 0
    for shape in shapes:
        at = -(-at // align) * align
        starts.append(at)
        at += math.prod(shape)
    work = xp.empty(at, dtype)
    if xp is np:  # (the simulator)
        return [work[a:a + math.prod(shape)].reshape(shape) for shape, a in zip(shapes, starts)]
    # arrays made on the buffer's addresses: a CuPy slice costs several times as much on the host
    base, dtype, itemsize = work.data, work.dtype, work.itemsize
    return [xp.ndarray(shape, dtype, memptr=base + a * itemsize if math.prod(shape) else None)
            for shape, a in zip(shapes, starts)]


def is_device_array(x):
    """True for CuPy arrays and any other ``__cuda_array_interface__`` producer."""
    # CuPy builds the interface dict on every access: test its type first.
    return is_cupy_array(x) or hasattr(x, "__cuda_array_interface__")


def is_cupy_array(x):
    """True for ``cupy.ndarray`` (without importing CuPy when nobody has)."""
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


def array_module(x):
    """Return ``cupy`` for device arrays, else ``numpy``."""
    if is_device_array(x):
        return get_cupy()
    return np


def to_host(x):
    """Copy a device array to a NumPy array (no-op for NumPy)."""
    if isinstance(x, np.ndarray):
        return x
    if is_device_array(x) and hasattr(x, "get"):
        return x.get()  # synchronize!
    return np.asarray(x)
