"""Layer 1: the one type of a kernel launch (:class:`Launch`), its arguments named after the kernel's parameters.

A launch is made by :func:`make` from the kernel's family and name, its geometry, the names of the arrays a call
passes (its operands, in call order) and the value of every other parameter, by name.  Where each argument goes
and how its 8-byte slot holds it (a pointer, a 32- or 64-bit integer, a float's bits) is read from the kernel's
CUDA declaration (:func:`.registry.parameters`), so no argument list is written by position anywhere: a kernel
whose parameters are reordered takes the same launches, and a parameter that is not named, or a name the kernel
does not have, fails when the launch is made (a ``TypeError`` naming it).

A :class:`Scratch` argument is a buffer of the stream the launch runs on (partial results, counters), made on
that stream's first call and reused there.  :meth:`Launch.run` launches through the driver with the call's
arrays; :meth:`Launch.bind` fixes everything but them (:func:`.driver.bound_launch`), the form a repeated call,
a recorded layer and a CUDA-graph capture replay.
"""

import functools
import sys
from typing import NamedTuple

from .._device import get_cupy, zeros
from .driver import bound_launch, f32_bits, f64_bits, launch, slot_value
from .registry import get_kernel, parameters

__all__ = ["Launch", "Scratch", "make", "encode", "current_stream"]


def current_stream():
    """The current stream's pointer (CuPy is loaded wherever a launch runs)."""
    return sys.modules["cupy"].cuda.get_current_stream().ptr


class Scratch(NamedTuple):
    """A buffer a launch needs on each stream (partial tiles, counters of split windows): made on a stream's first
    call and reused there (calls on one stream run in order).  Launches that share a store share equal buffers."""

    kind: str  # what it holds: "partial", "counters", an attention pass's ("fwd part", ...)
    shape: tuple
    dtype: object
    zeros: bool = False  # counters start at zero (each call resets the ones it uses)

    def new(self):
        """A new buffer of this kind on the current device (zeroed where it counts)."""
        return (zeros if self.zeros else get_cupy().empty)(self.shape, self.dtype)

    def get(self, store, stream):
        """This buffer on ``stream`` (a stream pointer), from ``store``."""
        buf = store.get((self, stream))
        if buf is None:
            buf = store[self, stream] = self.new()
        return buf


#: ``[lo, hi)`` of each integer kind.
_BOUNDS = {"i32": (-(1 << 31), 1 << 31), "u32": (0, 1 << 32), "i64": (-(1 << 63), 1 << 63), "u64": (0, 1 << 64)}


def encode(value, kind):
    """The 8-byte slot of ``value`` for a parameter of ``kind`` (:data:`.registry.SCALAR_KINDS`, ``"ptr"``): an
    array's address (or an int address), 0 for None, an integer, a float's bits in the declared width;
    ``"value"`` (a template type) by the value's own type (:func:`.driver.slot_value`).  A value that does not fit
    raises."""
    bounds = _BOUNDS.get(kind)
    if bounds is not None and type(value) is int:  # (a size or a count: most scalars a launch is made with)
        if not bounds[0] <= value < bounds[1]:
            raise OverflowError(f"{value} does not fit a {kind} parameter")
        return value
    if kind == "ptr":
        if value is None:
            return 0
        if type(value) is int:  # an address (a row of a device table)
            return value
        if not hasattr(getattr(value, "data", None), "ptr"):
            raise TypeError(f"a pointer parameter takes a device array or None, not {type(value).__name__}")
        return value.data.ptr
    if kind == "f32":
        return f32_bits(float(value))
    if kind == "f64":
        return f64_bits(float(value))
    if kind == "value":
        return slot_value(value)
    if isinstance(value, float) or getattr(value, "dtype", None) is not None and value.dtype.kind == "f":
        raise TypeError(f"an integer parameter takes an integer, not {value!r}")
    v = int(value)
    lo, hi = _BOUNDS[kind]
    if not lo <= v < hi:
        raise OverflowError(f"{v} does not fit a {kind} parameter")
    return v


class Launch(NamedTuple):
    """One planned kernel launch: the kernel, its geometry, and its arguments around the arrays a call passes.

    Made by :func:`make`.  ``values`` holds every parameter's slot, the call's operands and the stream's scratch
    written per call at their positions (``slots``, ``scratch_at``).  ``then`` is a launch that follows on the
    same stream, taking the call's operand at that index (a product's fixup).  ``dense`` and ``n_slices`` are the
    products' (the values read dense; CTAs per unit, for reports).
    """

    family: str
    name: str
    grid: tuple
    block: tuple
    smem: int
    values: tuple  # per parameter, its slot (0 where a call or the stream writes it)
    slots: tuple  # per operand, in call order: the positions its address fills
    operands: tuple  # the operands' names (each a name, or a tuple of names one array fills)
    scratch_at: tuple = ()  # ((position, Scratch), ...): buffers of the stream a call runs on
    scratch: dict = None  # the per-stream store of those buffers
    held: tuple = ()  # the fixed arrays, alive as long as their addresses are kept here
    then: tuple = None  # (Launch, operand index): the launch after this one
    cooperative: bool = False
    dense: bool = False
    n_slices: int = 1

    def function(self):
        """The loaded ``CUfunction`` on the current device (compiled on first use)."""
        return get_kernel(self.family, self.name).kernel.ptr

    def arguments(self, arrays, stream=None):
        """Every parameter's slot for a call with ``arrays`` (its operands, in call order) on ``stream``."""
        values = list(self.values)
        if self.scratch_at:
            stream = current_stream() if stream is None else stream
            for i, s in self.scratch_at:
                values[i] = s.get(self.scratch, stream).data.ptr
        for at, a in zip(self.slots, arrays):
            p = 0 if a is None else a.data.ptr
            for i in at:
                values[i] = p
        return values

    def run(self, *arrays):
        """Launch on the current stream with these arrays (the operands, in call order)."""
        if len(arrays) != len(self.slots):
            raise TypeError(f"{self.name} takes {len(self.slots)} operands ({self.operands}), not {len(arrays)}")
        stream = current_stream()
        if self.cooperative:
            self.bind()(*arrays)
            return
        launch(self.function(), self.grid, self.block, self.arguments(arrays, stream), stream, self.smem)
        if self.then is not None:
            self.then[0].run(arrays[self.then[1]])

    def bind(self, rows=None):
        """``f(*arrays)``: this launch (and the one after it) through the driver, everything but the call's arrays
        fixed, on the stream current now.  ``rows``: ``(parameter name, rows per block[, most blocks])`` of a
        launch whose row count varies per call, as ``f(m, *arrays)`` (:func:`.driver.bound_launch`)."""
        stream = current_stream()
        values = self.arguments((None,) * len(self.slots), stream)
        held = self.held + tuple(s.get(self.scratch, stream) for _, s in self.scratch_at)
        then = None if self.then is None else (self.then[0].bind(), self.then[1])
        if rows is not None:
            name, *counts = rows
            where = _table(self.family, self.name)[1]
            if name not in where:
                raise TypeError(f"{self.name} has no parameter {name!r}")
            rows = (where[name], *(int(c) for c in counts))
        f = bound_launch(self.function(), self.grid, self.block, values, self.slots, stream, self.smem, then,
                         self.cooperative, rows)
        f.held = held
        return f

    def fixed(self, *arrays):
        """``f()``: this launch (and the one after it) with these arrays, every slot written now, on the stream
        current now -- a replay that writes nothing per call, for a caller whose operands keep their addresses (a
        JAX program's buffers).  ``f.held`` keeps the arrays and the stream's scratch alive."""
        if len(arrays) != len(self.slots):
            raise TypeError(f"{self.name} takes {len(self.slots)} operands ({self.operands}), not {len(arrays)}")
        stream = current_stream()
        values = self.arguments(arrays, stream)
        held = self.held + tuple(s.get(self.scratch, stream) for _, s in self.scratch_at) + arrays
        f = bound_launch(self.function(), self.grid, self.block, values, (), stream, self.smem, None,
                         self.cooperative)
        if self.then is None:
            f.held = held
            return f
        follow = self.then[0].fixed(arrays[self.then[1]])

        def both():
            f()
            follow()

        both.held = (held, f, follow)
        return both

    def with_kernel(self, name, smem, dense=None):
        """This launch with the kernel ``name`` of the same family and parameters (another variant of one
        geometry: the timed choice's candidates), its shared memory ``smem``."""
        if parameters(self.family, name) != parameters(self.family, self.name):
            raise TypeError(f"{name} does not take the parameters of {self.name}")
        return self._replace(name=name, smem=smem, dense=self.dense if dense is None else dense)


def _dims(d):
    return tuple(d) if isinstance(d, (tuple, list)) else (d,)


@functools.cache
def _table(family, name):
    """``(parameters, {name: position})`` of a kernel, asked once per name expression."""
    params = parameters(family, name)
    return params, {p: i for i, (p, _) in enumerate(params)}


def _refuse(name, params, named):
    """Raise the ``TypeError`` of a launch whose names are not the kernel's parameters, each once."""
    where = {p for p, _ in params}
    unknown = [n for n in named if n not in where]
    if unknown:
        raise TypeError(f"{name} has no parameter {unknown[0]!r} (its parameters: {[p for p, _ in params]})")
    twice = sorted({n for n in named if named.count(n) > 1})
    if twice:
        raise TypeError(f"{name}: parameter {twice[0]!r} is given twice")
    missing = [p for p, _ in params if p not in named]
    raise TypeError(f"{name}: parameter {missing[0]!r} is not given")


def make(family, name, grid, block, operands, fixed, smem=0, scratch=None, then=None, cooperative=False,
         dense=False, n_slices=1):
    """The :class:`Launch` of the kernel ``name`` of ``family``.

    ``operands``: the names of the arrays a call passes, in call order (a tuple of names for an array that fills
    several parameters); ``fixed``: ``{name: value}`` of every other parameter (an array, None for a null pointer,
    a number, or a :class:`Scratch` of the ``scratch`` store).  Every parameter is named once, no more: a missing
    or unknown name raises ``TypeError``.  ``then``: ``(launch, operand name)``, a launch after this one taking
    that operand.
    """
    form = _form(family, name, tuple([o if type(o) is str else tuple(o) for o in operands]), tuple(fixed))
    values = [0] * form.n_params
    scratch_at, held = [], []
    for (n, i, kind), v in zip(form.fixed, fixed.values()):
        if isinstance(v, Scratch):
            if kind != "ptr":
                raise TypeError(f"{name}: parameter {n!r} is not a pointer")
            if scratch is None:
                raise TypeError(f"{name}: scratch {n!r} needs a scratch store")
            scratch_at.append((i, v))
            continue
        try:
            values[i] = encode(v, kind)
        except (TypeError, OverflowError) as e:
            raise type(e)(f"{name}: parameter {n!r}: {e}") from None
        if kind == "ptr" and v is not None:
            held.append(v)
    if then is not None:
        then = (then[0], [o if type(o) is str else o[0] for o in form.operands].index(then[1]))
    return Launch(family, name, _dims(grid), _dims(block), int(smem), tuple(values), form.slots, form.operands,
                  tuple(scratch_at), scratch, tuple(held), then, cooperative, dense, n_slices)


class _Form(NamedTuple):
    """What :func:`make` reads of a kernel's parameters for one way of naming them (its operands' names, its fixed
    parameters' names in order), worked out once: the checks of the names, and where each goes."""

    n_params: int
    fixed: tuple  # per fixed parameter, in the order named: (name, position, kind)
    slots: tuple  # per operand: the positions its address fills
    operands: tuple  # the operands' names (a name, or a tuple of names one array fills)


@functools.cache
def _form(family, name, operands, fixed_names):
    """The :class:`_Form` of a launch of ``name`` naming ``operands`` and ``fixed_names``; raises ``TypeError`` where
    the names are not the kernel's parameters, each once, or an operand is not a pointer.  A new matrix's launches
    are made with the names of every matrix before it (only the values change), so the checks run once per way of
    naming, not once per launch."""
    params, where = _table(family, name)
    groups = tuple((o,) if type(o) is str else o for o in operands)
    named = [n for g in groups for n in g] + list(fixed_names)
    if len(named) != len(params) or len(set(named)) != len(named) or not where.keys() >= set(named):
        _refuse(name, params, named)
    for g in groups:
        for n in g:
            if params[where[n]][1] != "ptr":
                raise TypeError(f"{name}: operand {n!r} is not a pointer parameter")
    return _Form(len(params), tuple((n, where[n], params[where[n]][1]) for n in fixed_names),
                 tuple(tuple(where[n] for n in g) for g in groups),
                 tuple(g[0] if len(g) == 1 else g for g in groups))
