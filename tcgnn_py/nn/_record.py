"""Layer 4: a layer's math written once, recorded by its general call and replayed as its bound call.

A layer writes each pass (forward, vjp) once, as a function of a tape ``t`` that calls primitives (:class:`Op`):
``t(op, *args)``.  The general call passes :func:`general`, which runs each op's general form (checked,
converting, planning); a general call that may bind passes a :class:`Tape`, which does the same and notes each
step's operands and result.  :func:`replay` turns that record into the bound call of its signature: each step is
the op's bound form for the recorded operands (:attr:`Op.bind`), each array operand taken from the call's inputs
or an earlier step's result, everything else fixed as recorded.  So the math is written once and its bound call
is its own record, launch for launch -- the same launches as the general call, hence the same bits.

A step's result that the call returns (or keeps for its vjp) is recycled by its bound form
(:func:`tcgnn_py.products.recycled`); one read within the call only is the bound call's own where small
(:func:`._bound.keeps`).  A record's control flow (which products run, a bias or none) is fixed by the signature
its bound call serves, as a product's plan is.
"""

from typing import NamedTuple

import numpy as np

from .._device import is_cupy_array
from . import _bound as bound

__all__ = ["Op", "Tape", "general", "replay"]


class Op(NamedTuple):
    """A primitive of a layer's math: ``run(*args)`` its general form; ``bind(*args, keep=False)`` its bound form
    for operands of these arguments' signature, called with the array arguments only (the others are fixed);
    ``keep``: its result is read within the call only, so it may be one array written by every call."""

    run: object
    bind: object


def general(op, *args):
    """The tape of a call that records nothing: the op's general form."""
    return op.run(*args)


def _is_array(a):
    return isinstance(a, np.ndarray) or is_cupy_array(a)


class Tape:
    """The tape of a general call that may bind: it runs each op's general form and records the step."""

    __slots__ = ("steps",)

    def __init__(self):
        self.steps = []

    def __call__(self, op, *args):
        out = op.run(*args)
        self.steps.append((op, args, out))  # (held: no array of the record is freed and its id reused)
        return out


def replay(tape, inputs, outputs):
    """``f(*inputs) -> outputs``: the record of ``tape`` bound, for inputs of the signature of ``inputs`` (None
    entries stay None); ``outputs`` are arrays of the record (or None) the call returns, in order."""
    where = {id(x): i for i, x in enumerate(inputs) if _is_array(x)}
    escapes = {id(o) for o in outputs if o is not None}
    n, steps = len(inputs), []
    for op, args, out in tape.steps:
        arrays = [a for a in args if _is_array(a)]
        missing = [a for a in arrays if id(a) not in where]
        if missing:
            raise ValueError(f"{op.run.__name__}: an operand comes from outside the record (a view made between "
                             "steps? pass its base to an op that takes it)")
        f = op.bind(*args, keep=id(out) not in escapes and bound.keeps(out.shape))
        steps.append((f, tuple(where[id(a)] for a in arrays)))
        where[id(out)] = n  # (an op in place returns its operand: later steps read this step's)
        n += 1
    at = tuple(None if o is None else where[id(o)] for o in outputs)

    def call(*inputs):
        env = list(inputs)
        for f, args in steps:
            env.append(f(*[env[i] for i in args]))
        return tuple(None if i is None else env[i] for i in at)

    return call
