"""Layer 4: XLA's FFI from Python -- a handler is a ``ctypes`` callback registered with ``jax.ffi``.

XLA's FFI is a C ABI of plain structs (``xla/ffi/api/c_api.h``): a handler receives one call frame (the API, its
execution context, the stage, the argument and result buffers, the attributes) and returns NULL or an error made
by the API.  The structs below are the parts of that header a handler reads; their layout is the header's.  A
handler first answers XLA's metadata query (the API version it speaks and its traits), then runs.  Nothing here
knows an operation: :func:`register` takes ``run(stream, args, rets, attrs)`` and does the rest.
"""

import ctypes
import enum

import numpy as np

from .._cache import keep

__all__ = ["Buffer", "register", "dtype_of", "API_VERSION"]

#: The FFI API version (major, minor) the handlers declare: the one XLA's typed FFI has spoken since its release.
API_VERSION = (0, 1)
#: CuPy views of XLA's device buffers kept (by address, shape and dtype), oldest dropped.  A view holds no memory
#: (XLA owns it); one of an address XLA has reused for another buffer is only used when XLA hands that buffer.
VIEWS_KEEP = 256

_VIEWS = {}


class _Stage(enum.IntEnum):  # XLA_FFI_ExecutionStage
    INSTANTIATE = 0
    PREPARE = 1
    INITIALIZE = 2
    EXECUTE = 3


_METADATA = 1  # XLA_FFI_Extension_Type: the metadata query
_SCALAR, _STRING = 3, 4  # XLA_FFI_AttrType
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


class Buffer:
    """An FFI buffer as the handler sees it: its address, dtype and shape (no copy; XLA owns the memory)."""

    __slots__ = ("ptr", "dtype", "shape")

    def __init__(self, ptr, dtype, shape):
        self.ptr, self.dtype, self.shape = ptr, dtype, shape

    @property
    def nbytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def numpy(self):
        """A NumPy view of a host buffer (the CPU backend's)."""
        n = self.nbytes
        raw = (ctypes.c_char * n).from_address(self.ptr) if n else bytearray()
        return np.frombuffer(raw, self.dtype).reshape(self.shape)

    def cupy(self):
        """A CuPy view of a device buffer (the GPU backend's), owned by XLA: kept per address, shape and dtype
        (:data:`VIEWS_KEEP`), as a jitted loop hands its calls the same few buffers again."""
        key = (self.ptr, self.shape, self.dtype)
        view = _VIEWS.get(key)
        if view is None:
            import cupy as cp

            if not self.nbytes:  # (an empty buffer may have no address to view)
                return cp.ndarray(self.shape, self.dtype)
            memory = cp.cuda.UnownedMemory(self.ptr, self.nbytes, None)
            view = keep(_VIEWS, key, cp.ndarray(self.shape, self.dtype, cp.cuda.MemoryPointer(memory, 0)), VIEWS_KEEP)
        return view


_I64 = 5  # XLA_FFI_DataType S64: the attributes' integers
_I64_PTR = ctypes.POINTER(ctypes.c_int64)
_BUFFER_PTR = ctypes.POINTER(_Buffer)


def _buffers(items):
    """The buffers of an argument or result list (each attribute read once: a ctypes read costs as much as a line
    of Python, and a call inside a jitted loop pays them all)."""
    out = []
    ptrs = items.items
    for i in range(items.size):
        b = ctypes.cast(ptrs[i], _BUFFER_PTR).contents
        code = b.dtype
        out.append(Buffer(b.data or 0, _DTYPES[code] if code in _DTYPES else dtype_of(code), tuple(b.dims[:b.rank])))
    return out


def _attrs(attrs):
    """The call's attributes: integer scalars and strings by name."""
    out = {}
    types, names, values = attrs.types, attrs.names, attrs.attrs
    for i in range(attrs.size):
        span = names[i].contents
        name = ctypes.string_at(span.ptr, span.len).decode()
        kind = types[i]
        if kind == _SCALAR:
            s = ctypes.cast(values[i], ctypes.POINTER(_Scalar)).contents
            if s.dtype == _I64:
                out[name] = ctypes.cast(s.value, _I64_PTR)[0]
            else:
                dt = dtype_of(s.dtype)
                out[name] = np.frombuffer(ctypes.string_at(s.value, dt.itemsize), dt)[0].item()
        elif kind == _STRING:
            s = ctypes.cast(values[i], ctypes.POINTER(_ByteSpan)).contents
            out[name] = ctypes.string_at(s.ptr, s.len).decode()
    return out


def _error(api, code, message):
    args = _ErrorCreateArgs(ctypes.sizeof(_ErrorCreateArgs), None, message.encode()[:4000], code)
    return api.contents.error_create(ctypes.byref(args))


_HANDLERS = {}  # name and platform -> the ctypes callback (it must outlive every program that calls it)


def register(name, platform, run, traits=0):
    """Register ``run(stream, args, rets, attrs)`` as FFI target ``name`` on ``platform`` ("cpu" or "CUDA").

    ``args`` and ``rets`` are :class:`Buffer` lists, ``attrs`` a dict, ``stream`` XLA's stream (a ``cudaStream_t``
    as an int; 0 on the host).  An exception becomes an XLA error whose message is the exception's, raised by the
    jitted call (``ValueError`` and ``TypeError`` as invalid arguments): a handler never takes the process down.
    ``traits``: ``XLA_FFI_Handler_Traits`` bits (0: XLA runs the call itself, never inside a command buffer)."""
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
            run(stream, _buffers(frame.args), _buffers(frame.rets), _attrs(frame.attrs))
            return None
        except (ValueError, TypeError, LookupError) as exc:
            return _error(frame.api, _ERROR_INVALID_ARGUMENT, f"{type(exc).__name__}: {exc}")
        except BaseException as exc:  # noqa: BLE001  (any failure is the call's error, never a crash)
            return _error(frame.api, _ERROR_INTERNAL, f"{type(exc).__name__}: {exc}")

    callback = _Handler(handler)
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(ctypes.cast(callback, ctypes.c_void_p).value),
                                platform=platform)
    _HANDLERS[key] = callback
