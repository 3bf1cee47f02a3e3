"""Layer 4: XLA's FFI from Python -- a handler is a ``ctypes`` callback registered with ``jax.ffi``.

XLA's FFI is a C ABI of plain structs (``xla/ffi/api/c_api.h``): a handler receives one call frame (the API, its
execution context, the stage, the argument and result buffers, the attributes) and returns NULL or an error made
by the API.  The structs below are the parts of that header a handler reads; their layout is the header's.  A
handler first answers XLA's metadata query (the API version it speaks and its traits), then runs.  Nothing here
knows an operation: :func:`register` takes ``run(stream, args, rets, value)`` and does the rest.

A call's work on the host is what a call inside a jitted loop costs beyond its kernels, so the handler reads
little: each buffer as a hashable ``(address, dtype code, shape)`` (an operation keys what it keeps for a call by
them) and one integer attribute, in which an operation encodes what it needs (names and several attributes
would each cost a decode per call).

XLA may record a call into a command buffer (a CUDA graph) and replay it without calling the handler, where the
GPU targets declare that trait (:data:`COMMAND_BUFFER_COMPATIBLE`; :data:`RECORDED_ENV` ``0`` turns it off).  A call XLA
records runs on a capturing stream, where nothing may wait for the device or upload, and which records what it
first plans, compiles and uploads: a signature's first recorded call therefore runs once before, on a stream of
its own with private buffers of the same shapes (a warm-up, as before any CUDA graph), and the recorded call then
launches.  What a recorded call allocates (scratch of the recording stream, a temporary) is baked into its graph,
so it comes from a memory pool of that call's own (its signature and XLA's buffers), which no other code is handed
and only a later recording of the same call reuses (:func:`recorded_nbytes`): the graphs holding one call's
recordings run in order on XLA's stream, each done with its temporaries when it ends.
"""

import contextlib
import ctypes
import enum
import functools
import os

import numpy as np

from .._cache import keep
from .._device import zeroed_apart

__all__ = ["register", "register_target", "dtype_of", "host_view", "device_view", "API_VERSION",
           "COMMAND_BUFFER_COMPATIBLE", "RECORDED_ENV", "WARMED_KEEP", "recorded_nbytes"]

#: The FFI API version (major, minor) the handlers declare: the one XLA's typed FFI has spoken since its release.
API_VERSION = (0, 1)
#: ``XLA_FFI_Handler_Traits`` bit: XLA may record the handler's calls into command buffers (CUDA graphs) and replay
#: them; a call launches the same kernels whenever it runs with the same buffers.
COMMAND_BUFFER_COMPATIBLE = 1
#: Signatures (target, attribute, buffer shapes and dtypes, device) warmed up before a recorded call, kept; one
#: dropped is warmed up again at its next recording (a repeat costs a call's work, never a wrong result).
WARMED_KEEP = 1024
#: CUDA's ``CUstreamCaptureMode``: a thread in relaxed mode may make calls that a capture in progress elsewhere
#: forbids by default (allocate, copy from the host, wait for another stream).
_CAPTURE_MODE_RELAXED = 2
#: CuPy views of XLA's device buffers kept (by address, dtype and shape), oldest dropped.  A view holds no memory
#: (XLA owns it); one of an address XLA has reused for another buffer is only used when XLA hands that buffer.
VIEWS_KEEP = 256

_VIEWS = {}


class _Stage(enum.IntEnum):  # XLA_FFI_ExecutionStage
    INSTANTIATE = 0
    PREPARE = 1
    INITIALIZE = 2
    EXECUTE = 3


_METADATA = 1  # XLA_FFI_Extension_Type: the metadata query
_SCALAR = 3  # XLA_FFI_AttrType
_ERROR_INVALID_ARGUMENT, _ERROR_INTERNAL = 3, 13  # XLA_FFI_Error_Code

#: XLA_FFI_DataType codes of the dtypes the operations take.
_DTYPES = {1: np.dtype(np.bool_), 2: np.dtype(np.int8), 3: np.dtype(np.int16), 4: np.dtype(np.int32),
           5: np.dtype(np.int64), 6: np.dtype(np.uint8), 7: np.dtype(np.uint16), 8: np.dtype(np.uint32),
           9: np.dtype(np.uint64), 10: np.dtype(np.float16), 11: np.dtype(np.float32), 12: np.dtype(np.float64)}
_BF16 = 16


def dtype_of(code):
    """The NumPy dtype of an XLA_FFI_DataType code (bfloat16 through ml_dtypes)."""
    if code == _BF16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        return _DTYPES[code]
    except KeyError:
        raise TypeError(f"an FFI buffer of XLA data type {code} is not one this library takes") from None


class _Extension(ctypes.Structure):
    pass


_Extension._fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int),
                       ("next", ctypes.POINTER(_Extension))]


class _Version(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.POINTER(_Extension)),
                ("major_version", ctypes.c_int), ("minor_version", ctypes.c_int)]


class _Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", _Version), ("traits", ctypes.c_uint32)]


class _MetadataExtension(ctypes.Structure):
    _fields_ = [("extension_base", _Extension), ("metadata", ctypes.POINTER(_Metadata))]


class _Buffer(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.POINTER(_Extension)),
                ("dtype", ctypes.c_int), ("data", ctypes.c_void_p), ("rank", ctypes.c_int64),
                ("dims", ctypes.POINTER(ctypes.c_int64))]


class _List(ctypes.Structure):  # XLA_FFI_Args and XLA_FFI_Rets: the same layout
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.POINTER(_Extension)),
                ("size", ctypes.c_int64), ("types", ctypes.POINTER(ctypes.c_int)),
                ("items", ctypes.POINTER(ctypes.c_void_p))]


class _ByteSpan(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _Scalar(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int), ("value", ctypes.c_void_p)]


class _Attrs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.POINTER(_Extension)),
                ("size", ctypes.c_int64), ("types", ctypes.POINTER(ctypes.c_int)),
                ("names", ctypes.POINTER(ctypes.POINTER(_ByteSpan))), ("attrs", ctypes.POINTER(ctypes.c_void_p))]


class _ErrorCreateArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.POINTER(_Extension)),
                ("message", ctypes.c_char_p), ("errc", ctypes.c_int)]


class _StreamGetArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.POINTER(_Extension)),
                ("ctx", ctypes.c_void_p), ("stream", ctypes.c_void_p)]


_ErrorCreate = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_ErrorCreateArgs))
_StreamGet = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_StreamGetArgs))


class _Api(ctypes.Structure):  # the leading fields of XLA_FFI_Api, in the header's order
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.POINTER(_Extension)),
                ("api_version", _Version), ("internal_api", ctypes.c_void_p),
                ("error_create", _ErrorCreate), ("error_get_message", ctypes.c_void_p),
                ("error_destroy", ctypes.c_void_p), ("handler_register", ctypes.c_void_p),
                ("stream_get", _StreamGet)]


class _CallFrame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.POINTER(_Extension)),
                ("api", ctypes.POINTER(_Api)), ("ctx", ctypes.c_void_p), ("stage", ctypes.c_int),
                ("args", _List), ("rets", _List), ("attrs", _Attrs), ("future", ctypes.c_void_p)]


_Handler = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_CallFrame))


def host_view(buffer):
    """A NumPy view of a host buffer ``(address, dtype code, shape)`` (the CPU backend's)."""
    ptr, code, shape = buffer
    dtype = dtype_of(code)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = (ctypes.c_char * n).from_address(ptr) if n else bytearray()
    return np.frombuffer(raw, dtype).reshape(shape)


def device_view(buffer, kept=True):
    """A CuPy view of a device buffer ``(address, dtype code, shape)`` (the GPU backend's), owned by XLA: kept per
    buffer (:data:`VIEWS_KEEP`), as a jitted loop hands its calls the same few buffers again -- or a new view
    (``kept=False``) for an operand that must not be known by its identity (values a cache would keep a form of:
    XLA writes new values at the same address)."""
    view = _VIEWS.get(buffer) if kept else None
    if view is None:
        import cupy as cp

        ptr, code, shape = buffer
        dtype = dtype_of(code)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not n:  # (an empty buffer may have no address to view)
            return cp.ndarray(shape, dtype)
        view = cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(ptr, n, None), 0))
        if kept:
            keep(_VIEWS, buffer, view, VIEWS_KEEP)
    return view


_I64 = 5  # XLA_FFI_DataType S64: the attributes' integers


def _buffers(items):
    """The buffers of an argument or result list, each ``(address, dtype code, shape)``."""
    return tuple([(b.data or 0, b.dtype, tuple(b.dims[:b.rank]))
                  for b in map(_Buffer.from_address, items.items[:items.size])])


def _value(attrs):
    """The call's one attribute, an int64 scalar."""
    if attrs.size != 1 or attrs.types[0] != _SCALAR:
        first = f", the first of XLA attribute type {attrs.types[0]}" if attrs.size else ""
        raise TypeError(f"a call of this FFI target carries one int64 attribute, got {attrs.size} attribute(s){first}")
    s = _Scalar.from_address(attrs.attrs[0])
    if s.dtype != _I64:
        raise TypeError(f"a call of this FFI target carries one int64 attribute, got XLA data type {s.dtype}")
    return ctypes.c_int64.from_address(s.value).value


def _error(api, code, message):
    args = _ErrorCreateArgs(ctypes.sizeof(_ErrorCreateArgs), None, message.encode()[:4000], code)
    return api.contents.error_create(ctypes.byref(args))


def _capturing(stream):
    """Whether XLA is recording the call on ``stream`` into a command buffer."""
    import cupy as cp

    return bool(stream) and cp.cuda.runtime.streamIsCapturing(stream)


@contextlib.contextmanager
def _relaxed():
    """This thread in relaxed capture mode (restored after): XLA records in thread-local mode, where the thread
    that captures may not allocate, upload or wait, not even on another stream -- what a warm-up does."""
    driver = _driver()
    mode = ctypes.c_int(_CAPTURE_MODE_RELAXED)
    err = driver.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
    if err:
        raise RuntimeError(f"cuThreadExchangeStreamCaptureMode failed with CUDA driver error {err}")
    try:
        yield
    finally:
        driver.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))


@functools.cache
def _driver():
    """The CUDA driver library (``ctypes``), loaded once."""
    return ctypes.CDLL("libcuda.so.1")


_WARMED = {}
_SIDE = {}  # device -> the warm-ups' stream
_POOLS = {}  # a recorded call's signature and buffers -> the memory pool of what its recordings allocate


def recorded_nbytes():
    """Bytes held by the memory pools of calls XLA recorded into command buffers (their graphs may write them)."""
    return sum(pool.total_bytes() for pool in _POOLS.values())


def _recorded(name, run, stream, args, rets, value):
    """``run`` on XLA's capturing ``stream``, after a warm-up on a stream of its own where its signature has not
    had one: private zeroed buffers of the same shapes and dtypes, waited for, so what a first call plans,
    compiles, uploads and allocates is ready, and the recorded call only launches -- allocating, where it must,
    from the call's own memory pool, and zeroing apart (:func:`tcgnn_py._device.zeroed_apart`): XLA updates a
    recorded call in place with its next recording, which must have the same nodes."""
    import cupy as cp

    with _relaxed():
        device = cp.cuda.runtime.getDevice()
        key = (name, value, tuple((c, s) for _, c, s in args), tuple((c, s) for _, c, s in rets), device)
        side = _SIDE.get(device)
        if side is None:
            side = _SIDE[device] = cp.cuda.Stream(non_blocking=True)
        if key not in _WARMED:
            with side:
                private = [cp.zeros(shape, dtype_of(code)) for _, code, shape in args + rets]
                buffers = [(a.data.ptr, code, shape) for a, (_, code, shape) in zip(private, args + rets)]
                call = functools.partial(run, side.ptr, tuple(buffers[:len(args)]), tuple(buffers[len(args):]), value)
                _WARM_UPS.get(name, _once)(call)
            side.synchronize()
            del private
            keep(_WARMED, key, True, WARMED_KEEP)
        pool = _POOLS.get(key + (stream, args, rets))
        if pool is None:
            pool = _POOLS[key + (stream, args, rets)] = cp.cuda.MemoryPool()
        with cp.cuda.using_allocator(pool.malloc), zeroed_apart(side):  # (every recording of the same shape)
            run(stream, args, rets, value)


_HANDLERS = {}  # name and platform -> the ctypes callback (it must outlive every program that calls it)
_TARGETS = set()  # the names register_target has registered
_WARM_UPS = {}  # name -> the warm-up of a recorded signature (register_target's warm_up)


def _once(call):
    call()


#: Set to 0 before a process registers the targets (its first traced call) to keep XLA from recording the GPU's
#: calls into its command buffers (XLA then runs each call itself and cuts its command buffers around it).
RECORDED_ENV = "TCGNN_PY_JAX_COMMAND_BUFFERS"


def register_target(name, runs, recorded=None, warm_up=None):
    """Register ``runs`` (``{platform: run}``) as FFI target ``name``, once; returns ``name``.  A platform this JAX
    lacks (no CUDA plugin) is left out: its calls never lower there.  ``recorded``: XLA may record the GPU's calls
    into its command buffers (:data:`COMMAND_BUFFER_COMPATIBLE`); None: unless :data:`RECORDED_ENV` is ``0``.
    ``warm_up(call)``: a recorded signature's warm-up, given its one call on private buffers (None: that call
    once) -- XLA replays what it records without calling the handler again, so a call that settles its launch over
    calls (a product's timed choice) settles it in the warm-up, and the launch recorded is the one it settles on."""
    if warm_up is not None:
        _WARM_UPS[name] = warm_up
    if recorded is None:
        recorded = os.environ.get(RECORDED_ENV, "1") != "0"
    if name not in _TARGETS:
        for platform, run in runs.items():
            traits = COMMAND_BUFFER_COMPATIBLE if recorded and platform != "cpu" else 0
            try:
                register(name, platform, run, traits=traits)
            except Exception:  # noqa: BLE001
                if platform == "cpu":
                    raise
        _TARGETS.add(name)
    return name


def register(name, platform, run, traits=0):
    """Register ``run(stream, args, rets, value)`` as FFI target ``name`` on ``platform`` ("cpu" or "CUDA").

    ``args`` and ``rets`` are tuples of buffers, each ``(address, dtype code, shape)`` (:func:`host_view`,
    :func:`device_view`); ``value`` the int64 attribute every call of the target carries; ``stream`` XLA's stream
    (a ``cudaStream_t`` as an int; 0 on the host).  An exception becomes an XLA error whose message is the
    exception's, raised by the jitted call (``ValueError`` and ``TypeError`` as invalid arguments): a handler
    never takes the process down.
    ``traits``: ``XLA_FFI_Handler_Traits`` bits (0: XLA runs the call itself, never inside a command buffer;
    :data:`COMMAND_BUFFER_COMPATIBLE`: XLA may record it, and a call on a capturing stream is warmed up first)."""
    import jax

    key = (name, platform.lower())
    if key in _HANDLERS:
        return
    on_device = platform.lower() != "cpu"

    def handler(frame_ptr):
        frame = frame_ptr.contents
        try:
            ext = frame.extension_start
            while ext:
                if ext.contents.type == _METADATA:  # XLA's query before the first call: version and traits
                    meta = ctypes.cast(ext, ctypes.POINTER(_MetadataExtension)).contents.metadata.contents
                    meta.api_version.major_version, meta.api_version.minor_version = API_VERSION
                    meta.traits = traits
                    return None
                ext = ext.contents.next
            if frame.stage != _Stage.EXECUTE:
                return None
            stream = 0
            if on_device:
                get = _StreamGetArgs(ctypes.sizeof(_StreamGetArgs), None, frame.ctx, None)
                failed = frame.api.contents.stream_get(ctypes.byref(get))
                if failed:
                    return failed
                stream = get.stream or 0
            args, rets, value = _buffers(frame.args), _buffers(frame.rets), _value(frame.attrs)
            if traits & COMMAND_BUFFER_COMPATIBLE and on_device and _capturing(stream):
                _recorded(name, run, stream, args, rets, value)
            else:
                run(stream, args, rets, value)
            return None
        except (ValueError, TypeError, LookupError) as exc:
            return _error(frame.api, _ERROR_INVALID_ARGUMENT, f"{type(exc).__name__}: {exc}")
        except BaseException as exc:  # noqa: BLE001  (any failure is the call's error, never a crash)
            return _error(frame.api, _ERROR_INTERNAL, f"{type(exc).__name__}: {exc}")

    callback = _Handler(handler)
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(ctypes.cast(callback, ctypes.c_void_p).value),
                                platform=platform)
    _HANDLERS[key] = callback
