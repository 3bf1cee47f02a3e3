"""Layer 2: the timed choice among a family's bit-identical launches: it knows no family.

A family hands :func:`choose` itself and its candidate configurations (the statistics' default first); the
family says which kernels a configuration runs (``family.kernels``) and builds their launches in one pass
(``family.launches``); the autotuner compiles what is missing in the background, times the rest on the operands
being planned, and keeps the default unless another is clearly faster (:func:`pick_fastest`).  Every candidate
gives the same bits, so the choice changes speed only.
"""

import dataclasses
import functools

from .._device import get_cupy
from .._tuning import declare, int_option, options, overrides_key
from ._launch import Countdown, Provisional
from ._values import vec_dense_values

__all__ = ["TIMED_AFTER", "TIMED_MARGIN", "TIMED_MAX_WORK", "TIMED_ROUNDS", "choose", "pick_fastest", "settle",
           "timed_choices"]

#: The timed choice replaces the default launch only with one at least this much faster: timing noise
#: must not flip a product between launches from one process to the next.
TIMED_MARGIN = 0.03
#: Timed calls of each candidate (after a warm-up round); the least counts.
TIMED_ROUNDS = 3
#: Products of more blocks x features than this keep the statistics' launch untimed: calls of ~0.3 ms and more,
#: where timing 16 candidates costs ~100 ms and picked the statistics' launch on the 1M-node graphs anyway.
TIMED_MAX_WORK = 10**8


#: Calls of a product (its matrix and operand signature) on the statistics' launch before its timed choice runs:
#: timing a family's candidates costs what tens to hundreds of the product's calls do, which a matrix made, used a
#: few times and dropped (a batch's, a sampled block's) never earns back, and one that lives long does.  The
#: default of the ``timed_after`` option; 0 times on the first call.
TIMED_AFTER = 64
declare("plan", {"timed_after": (TIMED_AFTER, int_option(0))})


def settle(fn, sync=None):
    """Call ``fn`` until the products it runs use the launches a long loop settles on, then return: a product runs
    the statistics' launch for its first calls (the ``timed_after`` option), then times its candidates, whose
    kernels may compile in the background first; the calls after that run the launch chosen.  ``sync``
    (optional) waits for the device before the compiles are waited for.  A timing of a matrix that lives long is
    a timing of that launch, and a call recorded once (a CUDA graph, XLA's command buffer) keeps that launch."""
    from ..kernels.registry import wait_for_compiles

    for _ in range(options()["timed_after"] + 2):  # (the first call, the deferred ones, the timing one)
        fn()
    if sync is not None:
        sync()
    wait_for_compiles()
    for _ in range(2):  # (the call that times every compiled candidate, then the chosen launch, bound)
        fn()
    if sync is not None:
        sync()


def pick_fastest(ms, margin=TIMED_MARGIN):
    """Index of the fastest of ``ms``, or 0 (the default) unless that one is ``margin`` faster.

    >>> pick_fastest([10.0, 9.8, 12.0]), pick_fastest([10.0, 9.0, 12.0])
    (0, 1)
    """
    best = min(range(len(ms)), key=ms.__getitem__)
    return best if ms[best] < (1.0 - margin) * ms[0] else 0


def choose(family, tiling, dtype, D, vec, key, candidates, operands):
    """The launch of the fastest of ``candidates`` (``family``'s configurations, the default first), or a
    :class:`Provisional`.  ``candidates`` may be a callable ``candidates(first_only=False)`` giving them, and with
    ``first_only`` ``(default, whether it is the only one)`` without working out the others: a call that times
    nothing (a new matrix's first) needs the default alone.

    ``family.kernels(tiling, dtype, config)`` names the ``(family, name)`` kernels a candidate runs (nothing
    compiled, no launch built); ``family.launches(tiling, dtype, D, vec, configs)`` builds their launches in one
    pass (they share one partition and its scratch).  Each is called on ``operands``, the product being planned
    (``values, X, Y, ...``: it writes that product's result, which the planned call writes again; a launch that
    reads the values dense gets them so).  GPU time only (queued behind a spin kernel), one warm-up and
    :data:`TIMED_ROUNDS` calls each.
    Under CUDA-graph capture nothing can be timed, and products above :data:`TIMED_MAX_WORK` are not: the
    default is kept.  A first product does not wait for a family's worth of compiles: candidates whose
    kernels are not compiled yet compile in the background and are left out, and the launch stays
    provisional until they are done.  With the ``timed_after`` option N > 0 (:data:`TIMED_AFTER` by default)
    nothing is timed on a signature's first call: the default launch runs, provisional and bound, for N more calls
    (a :class:`Countdown`), and the call after them times.  The times
    are kept on the tiling under ``key + (tuning in effect,)``, where ``key`` is ``("timed", operands, D,
    aligned)`` (``operands``: X's type, or a tuple that starts with it).
    """
    def build(configs):
        return family.launches(tiling, dtype, D, vec, configs)

    first, alone = candidates(first_only=True) if callable(candidates) else (candidates[0], len(candidates) == 1)
    if alone or tiling.n_blocks * D > TIMED_MAX_WORK or get_cupy().cuda.get_current_stream().is_capturing():
        return build([first])[0]
    after = options()["timed_after"]
    deferred = ("timed deferred",) + key[1:] + (overrides_key(),)
    if after and tiling.peek(deferred) is None:  # (the default now; timed on the call after the next ``after``)
        tiling.put(deferred, True)
        return Provisional(build([first])[0], [Countdown(after)])
    # (imported here, past a first call's returns: that call's path imports nothing)
    from ..kernels.registry import background_compiles, compile_in_background, is_compiled
    from ..kernels.timing import time_round_robin

    if callable(candidates):
        candidates = candidates()
    needs = [family.kernels(tiling, dtype, c) for c in candidates]
    missing = {k for ks in needs[1:] for k in ks if not is_compiled(*k)} - set(needs[0])
    futures = []
    if missing and background_compiles():
        for kernel_family in sorted({f for f, _ in missing}):  # (the kernels' registry family)
            futures += compile_in_background(kernel_family, sorted(n for f, n in missing if f == kernel_family))
        candidates = [c for i, c in enumerate(candidates) if i == 0 or not missing.intersection(needs[i])]
    launches = build(candidates)
    if len(launches) > 1:
        ms = time_round_robin(_calls(tiling, launches, operands), TIMED_ROUNDS)
        tiling.put(key + (overrides_key(),), tuple(zip(candidates, ms)))
        best = launches[pick_fastest(ms)]
    else:
        best = launches[0]
    return Provisional(best, futures) if futures else best


def _calls(tiling, launches, operands):
    """A call of each launch on ``operands`` (``values`` first: dense where a launch reads them so)."""
    values, rest = operands[0], tuple(operands[1:])
    dense = vec_dense_values(tiling, values) if any(la.dense for la in launches) else None
    return [functools.partial(la.run, dense if la.dense else values, *rest) for la in launches]


def timed_choices(tiling):
    """What the timed choices on ``tiling`` measured: one dict per product signature timed (oldest first).

    Each has ``"x_dtype"``, ``"D"``, ``"aligned"``, ``"tuning"`` (the overrides in effect), ``"ms"``
    (each candidate's configuration as a flat dict -- the kernel's class name and parameters, the blocks per unit
    -> milliseconds, the default first) and ``"kept"``
    (the index of the launch kept, :func:`pick_fastest`).
    """
    out = []
    for key, ms in tiling.cached_items("timed"):
        _, operands, D, aligned, tuned = key
        x_dtype = operands if isinstance(operands, str) else operands[0]  # (X, split values, Y) of 16-bit X
        out.append({"x_dtype": x_dtype, "D": D, "aligned": aligned, "tuning": dict(tuned),
                    "ms": [(_as_dict(c), t) for c, t in ms], "kept": pick_fastest([t for _, t in ms])})
    return out


def _as_dict(config):
    """A configuration as one flat dict: its fields, a kernel config's as its class name and its parameters."""
    out = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            out[field.name] = type(value).__name__
            out.update(dataclasses.asdict(value))
        else:
            out[field.name] = value
    return out
