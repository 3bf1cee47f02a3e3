"""Layer 1: kernel launches straight through the CUDA driver, for the products' bound plans.

A launch from Python costs more in argument handling than in the driver: CuPy wraps every argument, and a Numba
kernel takes seven parameters per array.  :func:`launch` passes ``cuLaunchKernel`` a buffer with one 8-byte slot
per parameter -- pointers, 64-bit integers, and 32-bit values in the low half of their slot (little-endian, so the
driver reads them correctly) -- and :func:`bound_launch` keeps that buffer between calls, so a repeated product
only writes its operands' addresses.

The call itself goes through CuPy's Cython binding of ``cuLaunchKernel``
(``cupy.cuda.driver.launchKernel``, which releases the GIL around the driver
call as ``ctypes`` does), cheaper per call than ``ctypes`` and than a CuPy
``RawKernel`` call.  ``ctypes`` stays as the fallback where the binding is missing.

The functions are the ones CuPy loaded (``Function.ptr``), launched on the
stream the caller names (CuPy's current stream): stream order, the current
device and CUDA-graph capture behave as for any CuPy launch.
"""

import ctypes
import functools
import struct
import threading

import numpy as np

__all__ = ["launch", "bound_launch", "slot_value", "resident_blocks", "f32_bits", "f64_bits"]


@functools.cache
def _cuda():
    """``f(function, gx, gy, gz, bx, by, bz, shared, stream, params_address, 0)``; raises on a failed launch."""
    return _launcher("launchKernel", "cuLaunchKernel", extra=True)


@functools.cache
def _cooperative():
    """``f(function, gx, gy, gz, bx, by, bz, shared, stream, params_address)``: ``cuLaunchCooperativeKernel`` (every
    block resident at once, so blocks may wait for each other); raises on a failed launch."""
    return _launcher("launchCooperativeKernel", "cuLaunchCooperativeKernel", extra=False)


def _launcher(binding, symbol, extra):
    """CuPy's Cython binding ``binding`` of the driver's ``symbol`` (which raises CUDADriverError), else the symbol
    through ``ctypes``, raising on an error code; ``extra``: it takes cuLaunchKernel's last argument."""
    try:
        from cupy_backends.cuda.api import driver

        return getattr(driver, binding)
    except (ImportError, AttributeError):
        pass
    u, vp = ctypes.c_uint, ctypes.c_void_p
    f = getattr(ctypes.CDLL("libcuda.so.1"), symbol)
    f.argtypes = [vp, u, u, u, u, u, u, u, vp, vp] + ([vp] if extra else [])
    f.restype = ctypes.c_int

    def ctypes_launch(*args):
        err = f(*args)
        if err:
            raise RuntimeError(f"{symbol} failed with CUDA error {err}")

    return ctypes_launch


def resident_blocks(function_ptr, threads, shared_mem=0):
    """How many blocks of ``threads`` of a loaded function one SM holds at once
    (``cuOccupancyMaxActiveBlocksPerMultiprocessor``): a cooperative launch takes at most that many per SM."""
    lib = ctypes.CDLL("libcuda.so.1")
    n = ctypes.c_int()
    err = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), ctypes.c_void_p(function_ptr),
                                                          ctypes.c_int(threads), ctypes.c_size_t(shared_mem))
    if err:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed with CUDA error {err}")
    return n.value


def _slots(n):
    """``(buffer, address)``: ``n`` 8-byte slots, followed in the same buffer by the table of their addresses that
    ``cuLaunchKernel`` takes, and that table's address.  One ctypes array filled from a list: a ``c_void_p`` array
    built from the addresses one by one was the largest share of the host time a bound launch takes to make."""
    n = max(n, 1)
    buf = (ctypes.c_int64 * (2 * n))()
    base = ctypes.addressof(buf)
    buf[n:] = list(range(base, base + 8 * n, 8))
    return buf, base + 8 * n


_local = threading.local()  # per thread: slots by parameter count (the driver copies them during the call)


_addressed = set()  # types whose instances' ``.data.ptr`` is their device address (CuPy's ndarray), seen so far


_F32, _I32, _F64, _I64 = (struct.Struct(f) for f in ("<f", "<i", "<d", "<q"))


def f32_bits(x):
    """The bits of float ``x`` (exactly a float32) as a signed 32-bit integer."""
    return _I32.unpack(_F32.pack(x))[0]


def f64_bits(x):
    """The bits of float ``x`` as a float64, as a signed 64-bit integer."""
    return _I64.unpack(_F64.pack(x))[0]


def slot_value(a):
    """The 8-byte slot of one kernel argument: a device array's address, an integer, a float's bits, or 0 for None.

    Device arrays, None, Python ints and floats are answered first (a launch writes a dozen slots or more per
    call), a float's bits by ``struct`` rather than a NumPy view.
    """
    t = type(a)
    if t in _addressed:
        return a.data.ptr
    if a is None:
        return 0
    if t is int:
        return a
    if t is float:
        return f64_bits(a)
    if t is np.float32:
        return f32_bits(float(a))
    data = getattr(a, "data", None)
    if data is not None and hasattr(data, "ptr"):
        _addressed.add(t)
        return data.ptr
    if isinstance(a, (np.floating, float)):
        return f32_bits(float(a)) if isinstance(a, np.float32) else f64_bits(float(a))
    return int(a)


def _dims(d):
    return (d + (1, 1))[:3] if isinstance(d, tuple) else (d, 1, 1)


def launch(function_ptr, grid, block, values, stream_ptr, shared_mem=0):
    """Launch a loaded function with the parameter slots ``values`` (a sequence of ints)."""
    cache = getattr(_local, "slots", None)
    if cache is None:
        cache = _local.slots = {}
    n = len(values)
    slots = cache.get(n)
    if slots is None:
        slots = cache[n] = _slots(n)
    buf, table = slots
    buf[:n] = values
    _cuda()(function_ptr, *_dims(grid), *_dims(block), shared_mem, stream_ptr, table, 0)


def bound_launch(function_ptr, grid, block, args, variable, stream_ptr, shared_mem=0, then=None, cooperative=False,
                 rows=None):
    """A launch whose parameters are fixed but for a few slots (the operands), as ``f(*arrays)`` that writes the
    arrays' addresses into their slots and launches.

    ``f`` is a closure, not an object: a call is the few statements it needs (each attribute lookup or loop step
    costs about as much on the host as a kernel runs on a small graph).  The slots are shared between calls, so
    a lock makes a call's writes and its launch one step (the driver reads the slots during the call, with the
    GIL released).

    Parameters
    ----------
    function_ptr : int
        A ``CUfunction`` (CuPy's ``Function.ptr``).
    grid, block : int or tuple
    args : sequence
        The arguments; those at ``variable`` positions are placeholders.
    variable : sequence of int or of tuples of int
        For each array ``f`` takes, in order, the argument position (or positions) that receive its address.
    stream_ptr : int
    shared_mem : int
    then : (callable, int), optional
        A bound launch that follows on the same stream, taking the call's array at that index (a product's
        fixup): one call runs both.
    cooperative : bool, default False
        A cooperative launch (:func:`_cooperative`): the grid must fit the GPU at once (:func:`resident_blocks`).
    rows : (int, int) or (int, int, int), optional
        ``(position, rows per block[, most blocks])``: the launch's row count varies per call, as ``f(m,
        *arrays)``, which writes ``m`` at that argument position and launches ``ceil(m / rows per block)`` blocks
        along x (at least one, at most ``most blocks``) -- one bound launch for every row count of a signature (a
        layer's products over a new batch's nodes each step), where binding per shape would cost each new shape
        more than its launch.
    """
    keep = tuple(args)  # the fixed arrays must outlive the addresses kept here
    buf, table = _slots(len(args))
    if set(map(type, keep)) == {int}:  # (a launch's slots are Python ints already: :meth:`Launch.bind` encoded them)
        buf[: len(keep)] = keep
    else:  # (arrays, None, floats, NumPy scalars; a 0-d array's __index__ would give its value, not its address)
        buf[: len(keep)] = [slot_value(a) for a in keep]
    variable = tuple(v if isinstance(v, tuple) else (v,) for v in variable)
    launch = _cooperative() if cooperative else _cuda()
    params = (function_ptr, *_dims(grid), *_dims(block), shared_mem, stream_ptr, table)
    if not cooperative:
        params += (0,)  # (cuLaunchKernel's extra options: none)
    lock = threading.Lock()
    enter, leave = lock.acquire, lock.release
    if rows is not None:
        if then is not None:
            raise TypeError("a launch of rows per call takes no launch after it")
        return _counted(buf, rows, variable, launch, params, enter, leave, (keep, buf))
    if then is None and all(len(v) == 1 for v in variable) and len(variable) <= 4:
        return _fixed(buf, tuple(v[0] for v in variable), launch, params, enter, leave, (keep, buf))

    def call(*arrays):
        enter()
        try:
            for slots, a in zip(variable, arrays):
                p = a.data.ptr
                for i in slots:
                    buf[i] = p
            launch(*params)
        finally:
            leave()
        if then is not None:
            then[0](arrays[then[1]])

    call.kept = (keep, buf)
    return call


def _counted(buf, rows, variable, launch, params, enter, leave, kept):
    """:func:`bound_launch`'s call ``f(m, *arrays)`` of a launch whose rows (``m``, and the grid's x) vary per call."""
    at, per, most = rows if len(rows) == 3 else (*rows, (1 << 31) - 1)
    head, tail = params[:1], params[2:]

    def call(m, *arrays):
        enter()
        try:
            buf[at] = m
            for slots, a in zip(variable, arrays):
                p = a.data.ptr
                for i in slots:
                    buf[i] = p
            launch(*head, min(max(1, -(-m // per)), most), *tail)
        finally:
            leave()

    call.kept = kept
    return call


def _fixed(buf, at, launch, params, enter, leave, kept):
    """:func:`bound_launch`'s call for up to four arrays, each at one position, written out."""
    if len(at) == 1:
        (i,) = at

        def call(a):
            enter()
            try:
                buf[i] = a.data.ptr
                launch(*params)
            finally:
                leave()
    elif len(at) == 2:
        i, j = at

        def call(a, b):
            enter()
            try:
                buf[i] = a.data.ptr
                buf[j] = b.data.ptr
                launch(*params)
            finally:
                leave()
    elif len(at) == 3:
        i, j, k = at

        def call(a, b, c):
            enter()
            try:
                buf[i] = a.data.ptr
                buf[j] = b.data.ptr
                buf[k] = c.data.ptr
                launch(*params)
            finally:
                leave()
    elif len(at) == 4:
        i, j, k, m = at

        def call(a, b, c, d):
            enter()
            try:
                buf[i] = a.data.ptr
                buf[j] = b.data.ptr
                buf[k] = c.data.ptr
                buf[m] = d.data.ptr
                launch(*params)
            finally:
                leave()
    else:
        def call():
            enter()
            try:
                launch(*params)
            finally:
                leave()
    call.kept = kept
    return call
