"""Layer 1: the compile registry of the CuPy RawModule kernel families.

A family is one CUDA source with its name expressions, generated from one table
of template arguments.  Each family module registers its families (:func:`register`) when it is
imported (:mod:`.products`, :mod:`.nn` and :mod:`.timing`, which the ``kernels``
package imports; the benchmarks' baseline SDDMM from :mod:`tcgnn_py.bench`), so
this module knows no family and imports none.  CI compiles every family of :func:`families`
through NVRTC directly, without a GPU (``tests/test_nvrtc.py``).

Compiled means asked for: each kernel is its own RawModule (the family's source
with one name expression), compiled the first time a call needs it, once per
process and device; CuPy keeps the binary in its disk cache, keyed by source,
options and name.  A whole family compiles in tens of seconds, one kernel in a
fraction of one, so a first product waits for its own kernel only.  The timed
choice's other candidates compile on one background thread
(:func:`compile_in_background`) while the product runs with the default.
"""

import atexit
import concurrent.futures
import functools
import os
import queue
import re
import threading

from .._capture import before_capture

__all__ = [
    "OPTIONS",
    "VALUE_TYPES",
    "families",
    "register",
    "get_kernel",
    "is_compiled",
    "compile_in_background",
    "background_compiles",
    "stop_background_compiles",
    "wait_for_compiles",
    "track",
    "compile_count",
    "parameters",
    "kernel_parameters",
]

#: NVRTC options shared by every family (CuPy adds the target architecture).
OPTIONS = ("--std=c++17",)

#: NumPy value type name -> CUDA C++ type, for every family's template arguments.
VALUE_TYPES = {"float32": "float", "float64": "double"}

_FAMILIES = {}  # family -> (CUDA source, name expressions), as registered
_lock = threading.Lock()
_modules = {}  # (family, name, device) -> compiled RawModule
_pending = {}  # (family, name, device) -> Future of a background compile
_work = queue.Queue()  # (key, Future) for the background worker; None stops it
_worker = []  # the one background thread, started on first use
_compiled = [0]
_background_on = [True]


def register(family, source, names):
    """Add a kernel family: its CUDA source and the name expressions it is compiled for.

    Registering the same family again with the same source and names does nothing; another
    source or name list under a registered name raises ``ValueError``.
    """
    names = tuple(names)
    with _lock:
        if _FAMILIES.get(family, (source, names)) != (source, names):
            raise ValueError(f"kernel family {family!r} is already registered")
        _FAMILIES[family] = (source, names)


def families():
    """``family -> (CUDA source, name expressions)`` of every registered family."""
    return dict(_FAMILIES)


def _compile(family, name, device_id):
    """One kernel's RawModule, compiled and loaded (on any thread)."""
    import cupy

    if family not in _FAMILIES:
        raise KeyError(f"no kernel family {family!r} is registered (registered: {sorted(_FAMILIES)})")
    code, names = _FAMILIES[family]
    if name not in names:
        raise KeyError(f"{name!r} is not a compiled variant of the kernel family {family!r}")
    with cupy.cuda.Device(device_id):
        mod = cupy.RawModule(code=code, options=OPTIONS, name_expressions=(name,))
        mod.compile()
    return mod


def _module(family, name, device_id):
    key = (family, name, device_id)
    mod = _modules.get(key)
    if mod is not None:
        return mod
    with _lock:
        fut = _pending.get(key)
        if fut is not None and fut.cancel():  # queued, not started: compile it here, now, not behind the queue
            del _pending[key]
            fut = None
    if fut is not None:
        return fut.result()  # its background compile is under way: wait for that one
    return _store(key, _compile(family, name, device_id))


def _store(key, mod):
    """Keep a compiled module (the first one stored wins) and drop its pending entry."""
    with _lock:
        if key not in _modules:
            _modules[key] = mod
            _compiled[0] += 1
        _pending.pop(key, None)
        return _modules[key]


@functools.cache
def _kernel(family, name, device_id):
    return _module(family, name, device_id).get_function(name)


def get_kernel(family, name):
    """The compiled kernel ``name`` of ``family`` on the current device (compiled on first use)."""
    import cupy

    return _kernel(family, name, cupy.cuda.runtime.getDevice())


def is_compiled(family, name):
    """Whether ``name`` of ``family`` is ready on the current device (asking costs no compile)."""
    import cupy

    return (family, name, cupy.cuda.runtime.getDevice()) in _modules


def _background(key):
    try:
        mod = _compile(*key)
    except BaseException:
        with _lock:
            _pending.pop(key, None)  # a later get_kernel compiles it again, on the caller's thread, and raises there
        raise
    return _store(key, mod)


def _serve():
    while True:
        item = _work.get()
        if item is None:
            return
        key, fut = item
        if not fut.set_running_or_notify_cancel():
            continue
        try:
            fut.set_result(_background(key))
        except BaseException as e:  # noqa: BLE001  handed to whoever waits for it
            fut.set_exception(e)


def _forget_worker():
    """In a forked child: the worker thread did not come along, so its queue and futures are dropped."""
    global _lock, _work
    _lock, _work = threading.Lock(), queue.Queue()
    _worker.clear()
    _pending.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_worker)


@atexit.register
def _stop():
    """At exit, drop the compiles nobody waited for: the worker finishes the one it is in, then stops."""
    if not _worker:
        return
    with _lock:
        for key, fut in list(_pending.items()):
            if fut.cancel():
                del _pending[key]
    _work.put(None)
    _worker[0].join(timeout=60)


def background_compiles():
    """Whether :func:`compile_in_background` is in use in this process (see :func:`stop_background_compiles`)."""
    return _background_on[0]


def stop_background_compiles():
    """From now on, compile on the calling thread only (the timed choice then compiles its candidates itself).

    Processes that run NCCL collectives call it: a module loaded by another
    thread while an NCCL kernel waits for a peer can deadlock the two.
    """
    _background_on[0] = False
    wait_for_compiles()


def compile_in_background(family, names):
    """Start compiling ``names`` of ``family`` for the current device on the background worker.

    Returns the futures of those not compiled yet.  Kernels compile one after
    another on one daemon thread, so a product on the main thread keeps a core,
    and a process that ends drops the compiles it never needed.
    """
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    futures = []
    with _lock:
        if not _worker:
            _worker.append(threading.Thread(target=_serve, name="tcgnn-compile", daemon=True))
            _worker[0].start()
        for name in names:
            key = (family, name, dev)
            if key in _modules:
                continue
            fut = _pending.get(key)
            if fut is None:
                fut = _pending[key] = concurrent.futures.Future()
                _work.put((key, fut))
            futures.append(fut)
    return futures


def track(future):
    """Count a background compile made elsewhere (a Numba kernel family's, on a thread of its own) among those
    :func:`wait_for_compiles` waits for: a benchmark times nothing, and a CUDA graph captures nothing, while any
    compile shares the process with it.  ``future`` is a :class:`concurrent.futures.Future` that its thread
    marks running before handing it here and completes when it ends; it leaves the pending set then, so a later
    :func:`wait_for_compiles` (or a look at what is pending) finds nothing of it."""
    key = ("tracked", id(future))
    with _lock:
        _pending[key] = future

    def forget(done):
        with _lock:
            if _pending.get(key) is done:
                del _pending[key]

    future.add_done_callback(forget)


def wait_for_compiles():
    """Block until every background compile has finished (benchmarks call it before timing), those of
    :func:`track` included.

    Re-raises the first error a background compile met.
    """
    while True:
        with _lock:
            futures = list(_pending.values())
        if not futures:
            return
        for fut in futures:
            if not fut.cancelled():
                fut.result()
        with _lock:  # a cancelled future's key was taken over by a caller, who removed it
            for key in [k for k, f in _pending.items() if f.done()]:
                del _pending[key]


def compile_count():
    """How many kernels were compiled (or loaded from CuPy's disk cache) so far in this process."""
    return _compiled[0]


before_capture(wait_for_compiles)  # no module loads by the worker while a CUDAGraph captures


#: A scalar parameter's CUDA type -> how its 8-byte slot holds a value (:func:`~.driver.slot_value` writes the
#: pointers).  A type that is a template parameter (``T``) is ``"value"``: the slot takes the value's own width.
SCALAR_KINDS = {"int": "i32", "unsigned": "u32", "unsigned int": "u32", "long long": "i64",
                "unsigned long long": "u64", "float": "f32", "double": "f64"}


def _closing(text, i):
    """The index of the parenthesis closing the one at ``i``."""
    depth = 0
    for k in range(i, len(text)):
        depth += {"(": 1, ")": -1}.get(text[k], 0)
        if depth == 0:
            return k
    raise ValueError("unbalanced parentheses in a kernel declaration")


def kernel_parameters(source):
    """``{function: ((name, kind), ...)}`` of every ``__global__`` function in a CUDA ``source``, in declaration
    order: ``kind`` is ``"ptr"`` for a pointer, else a :data:`SCALAR_KINDS` value (``"value"`` for a template
    type).  The declaration is the one truth of a launch's argument order, so launches name their arguments and
    this reads where each goes (comments are skipped; ``__launch_bounds__(...)`` may stand before the name)."""
    text = re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", source), flags=re.S)
    out = {}
    for m in re.finditer(r"\b__global__\b", text):
        i = m.end()
        bounds = re.match(r"\s*(?:void\s+)?__launch_bounds__\s*", text[i:])
        if bounds:
            i = _closing(text, i + bounds.end()) + 1
        head = re.match(r"\s*(?:void\s+)?(\w+)\s*\(", text[i:])
        if head is None:
            raise ValueError(f"cannot read the __global__ declaration at: {text[m.start():m.start() + 80]!r}")
        name, start = head.group(1), i + head.end() - 1
        params = []
        for decl in filter(None, (d.strip() for d in text[start + 1:_closing(text, start)].split(","))):
            decl = " ".join(decl.replace("__restrict__", " ").split())
            ctype, _, pname = decl.rpartition(" ")
            pname = pname.lstrip("*&")
            if "*" in decl:
                kind = "ptr"
            else:
                ctype = " ".join(w for w in ctype.split() if w != "const")
                kind = SCALAR_KINDS.get(ctype, "value" if re.fullmatch(r"[A-Z]\w*", ctype) else None)
                if kind is None:
                    raise ValueError(f"kernel {name}: parameter {pname!r} of type {ctype!r} has no slot kind")
            params.append((pname, kind))
        if out.get(name, params) != params:
            raise ValueError(f"kernel {name} is declared twice with different parameters")
        out[name] = tuple(params)
    return out


@functools.cache
def _family_parameters(family, source):
    return kernel_parameters(source)


def parameters(family, name):
    """``((name, kind), ...)``: the parameters of the kernel ``name`` of ``family`` (a name expression: its
    function's name before any template arguments), read from the family's CUDA source once per family."""
    if family not in _FAMILIES:
        raise KeyError(f"no kernel family {family!r} is registered (registered: {sorted(_FAMILIES)})")
    table = _family_parameters(family, _FAMILIES[family][0])
    base = name.partition("<")[0].strip()
    if base not in table:
        raise KeyError(f"the kernel family {family!r} declares no __global__ function {base!r}")
    return table[base]
