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

import functools
from typing import NamedTuple

import numpy as np

from .._device import is_cupy_array
from . import _bound as bound
from ._edges import features_on

__all__ = ["Op", "Tape", "Bound", "bind", "general", "replay", "cotangent", "general_vjp", "input_grad_option",
           "no_options"]


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


def _variable(x):
    """Whether an input is passed anew by each call (an array, or an object such as a random generator), rather
    than a constant of the signature (None, a number, a string)."""
    return x is not None and not isinstance(x, (bool, int, float, str))


def replay(tape, inputs, outputs, vjp=None):
    """``f(*inputs) -> outputs``: the record of ``tape`` bound, for inputs of the signature of ``inputs`` (None
    entries stay None); ``outputs`` are values of the record (or None) the call returns, in order.  None where an
    op has no bound form for its operands, or an operand is an array made outside the record (a conversion of an
    input, or a view: the call would do more than its launches; an op takes the base array instead).

    A step's operands that are arrays or the call's inputs are passed anew (its bound form takes those, in order);
    the others are fixed as recorded.  A step whose result is a tuple provides each element.  With ``vjp``, the
    call returns ``(outputs[0], partial(vjp, inputs + outputs, len(inputs)))`` instead (a layer's bound forward
    call: its output and its vjp, which reads what the call saw and made)."""
    where = {id(x): i for i, x in enumerate(inputs) if _variable(x)}
    escapes = {id(o) for o in outputs if o is not None}
    n, steps = len(inputs), []
    for op, args, out in tape.steps:
        variable = [a for a in args if id(a) in where or _is_array(a)]
        if any(id(a) not in where for a in variable):
            return None  # an array made outside the record (an input converted): a call would do more than launch
        parts = out if type(out) is tuple else (out,)
        f = op.bind(*args, keep=all(id(o) not in escapes and bound.keeps(o.shape) for o in parts))
        if f is None:
            return None
        steps.append((f, tuple(where[id(a)] for a in variable), type(out) is tuple))
        for o in parts:  # (an op in place returns its operand: later steps read this step's)
            where[id(o)] = n
            n += 1
    at = tuple(-1 if o is None else where[id(o)] for o in outputs)  # (-1: the None the call's list ends with)
    steps = tuple(steps)
    n_inputs, partial = len(inputs), functools.partial

    def call(*inputs):  # (list displays, not generators: a generator's every step is a Python call)
        env = list(inputs)
        for f, args, several in steps:
            if several:
                env.extend(f(*[env[i] for i in args]))
            else:
                env.append(f(*[env[i] for i in args]))
        env.append(None)
        results = tuple([env[i] for i in at])
        if vjp is None:
            return results
        return results[0], partial(vjp, inputs + results, n_inputs)

    return call


class Bound:
    """A layer's bound calls (:mod:`._bound`): its forward record replayed (``call(*inputs) -> (out, vjp)``), and
    its vjp -- ``grads(t, *inputs, *results, g, *options)`` on a tape -- recorded and bound per cotangent signature
    in its own store.  ``options(*args, **kwargs)`` reads the vjp's options after ``g`` (a tuple, in the key)."""

    __slots__ = ("E", "call", "grads", "options", "defaults", "backward")

    def __init__(self, E, tape, inputs, results, grads, options=None):
        options = no_options if options is None else options
        self.E, self.grads, self.options, self.defaults = E, grads, options, options()
        self.backward = bound.Calls()
        self.call = replay(tape, inputs, results, self.vjp)
        if self.call is not None:
            self.call.backward = self.backward  # (what a graph's store shows of the call: its bound vjps)

    def vjp(self, saved, n_inputs, g, *args, **kwargs):
        options = self.options(*args, **kwargs) if args or kwargs else self.defaults
        key, call = bound.lookup(self.E.matrix, (g,), options, self.backward.bound)
        if call is not None:
            return call(*saved, g)
        g = cotangent(self.E, g, saved[n_inputs].shape)
        tape = general if key is None else Tape()
        grads = self.grads(tape, *saved, g, *options)
        if key is not None:
            self.backward.seen(key, lambda: replay(tape, saved + (g,), grads))
        return grads


def bind(E, tape, inputs, results, grads, options=None):
    """A layer's bound forward call from its general call's record (``tape`` over ``inputs`` -> ``results``),
    ``call(*inputs) -> (results[0], vjp)``, the vjp :class:`Bound`'s (``call.backward``: its store of bound vjps);
    None where the record takes no bound call."""
    return Bound(E, tape, inputs, results, grads, options).call


def general_vjp(E, grads, options, saved, n_inputs, g, *args, **kwargs):
    """A layer's general vjp: ``g`` checked against the output (``saved[n_inputs]``, after the inputs), and its
    ``grads(t, *saved, g, *options(*args, **kwargs))`` run on :func:`general` (as :class:`Bound` runs them before
    it binds)."""
    return grads(general, *saved, cotangent(E, g, saved[n_inputs].shape), *options(*args, **kwargs))


def input_grad_option(input_grad=True):
    """The options of a vjp that takes ``input_grad`` (whether the input's gradient is wanted)."""
    return (bool(input_grad),)


def no_options():
    """The options of a vjp that takes none."""
    return ()


def cotangent(E, g, shape):
    """``g`` on E's device, checked to have the output's ``shape`` (a vjp's first check)."""
    g = features_on(E, g, "g")
    if g.shape != shape:
        raise ValueError(f"g must have the output's shape {shape}, got {g.shape}")
    return g
