"""Layer 0: launch options, each declared by the family that reads it, overridden only inside ``with tuning(...)``.

The options choose among launches that all give the same bits (the partition of the work, the launch
shape, which compiled variant runs), so they change speed only.  There is no global setting to mutate:
:func:`tuning` overrides options for the code inside its ``with`` block, in this thread (and asyncio task)
only, and a launch planned under overrides is cached under them, so the default launches are never
replaced by an experiment's.  Each product family declares its options (:func:`declare`) in its own module
(``tcgnn_py.products.families``), with the values each takes from its kernels' limits; the building options
are declared here, below the modules that read them.
"""

import contextlib
import contextvars
import math
import numbers
import operator
from types import MappingProxyType

__all__ = ["tuning", "options", "overrides_key", "state", "FAMILY_DEFAULTS", "FAMILY_ORDER", "DEFAULTS", "allowed", "declare",
           "bool_option", "int_option", "member_option", "positive_option", "warp_pair_option"]

#: The families that declare launch options, in the order the docs' table lists them.
FAMILY_ORDER = ("tf32", "core", "vec", "half", "build", "sparse", "plan")

_FAMILIES = {}  # family -> {option: default}, in FAMILY_ORDER
_DEFAULTS = {}  # option -> default, all families together (option names are unique across families)
_CHECKS = {}  # option -> (check, what it takes)
#: Each family's launch options and their defaults (read-only; filled as the families declare them; ``None``
#: means "from the tiling's statistics", the rule behind a default is beside its declaration).
FAMILY_DEFAULTS = MappingProxyType(_FAMILIES)
#: Every option and its default, all families together.
DEFAULTS = MappingProxyType(_DEFAULTS)


def int_option(lo, hi=None, none=False):
    """An int option in ``[lo, hi]`` (``None`` allowed where ``none``): ``(check, what it takes)``."""
    takes = (f"an int >= {lo}" if hi is None else f"an int in [{lo}, {hi}]") + (" or None" if none else "")

    def check(value):
        if value is None and none:
            return None
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
        if v < lo or (hi is not None and v > hi):
            raise ValueError
        return v

    return check, takes


def bool_option(none=False):
    """True or False (or None where ``none``)."""
    def check(value):
        if value is None and none:
            return None
        if type(value).__name__ not in ("bool", "bool_"):  # bool or numpy.bool_
            raise TypeError
        return bool(value)

    return check, "True or False" + (" or None" if none else "")


def positive_option(none=False):
    """A finite number > 0 (or None where ``none``)."""
    def check(value):
        if value is None and none:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError
        if not (math.isfinite(value) and value > 0):
            raise ValueError
        return value

    return check, "a finite number > 0" + (" or None" if none else "")


def warp_pair_option(hi):
    """None or a pair of warps per CTA (for 1 and 2 chunks), each in ``[1, hi]``: a kernel's launch bounds."""
    def check(value):
        if value is None:
            return None
        if not isinstance(value, (tuple, list)):  # a pair as written, not any iterable (an array, a set, a dict)
            raise TypeError
        pair = tuple(value)
        if len(pair) != 2:
            raise ValueError
        return tuple(int_option(1, hi)[0](v) for v in pair)

    return check, f"None or a pair of ints in [1, {hi}] (warps per CTA for 1 and 2 chunks), e.g. (4, 4)"


def member_option(configs, takes):
    """None or one of ``configs``, a family's compiled set (compiled means supported)."""
    def check(value):
        if value is not None and value not in configs:
            raise ValueError
        return value

    return check, takes


def declare(family, declared):
    """Declare ``family``'s options: ``{name: (default, (check, what it takes))}``, the pairs made by
    :func:`int_option` and its kin.  ``check(value)`` returns the value to use or raises ``TypeError`` /
    ``ValueError``.  A name is declared once, by one family.
    """
    if family not in FAMILY_ORDER:
        raise KeyError(f"{family!r} is not one of {FAMILY_ORDER}")
    again = sorted(set(declared) & set(_DEFAULTS))
    if again:
        raise KeyError(f"options declared twice: {again}")
    for name, (default, check) in declared.items():
        _DEFAULTS[name] = default
        _CHECKS[name] = check
    merged = {f: dict(_FAMILIES.get(f, {})) for f in FAMILY_ORDER}
    merged[family].update({name: default for name, (default, _) in declared.items()})
    _FAMILIES.clear()
    _FAMILIES.update({f: MappingProxyType(opts) for f, opts in merged.items() if opts})


def _checked(name, value):
    check, takes = _CHECKS[name]
    try:
        return check(value)
    except (TypeError, ValueError) as e:
        kind = TypeError if isinstance(e, TypeError) else ValueError
        raise kind(f"tuning option {name} takes {takes}, got {value!r:.80}") from None


def allowed():
    """``{option: what it takes}``, in words (the docs' table of options)."""
    return {name: _CHECKS[name][1] for name in DEFAULTS}


_CURRENT = contextvars.ContextVar("tcgnn_py_tuning", default=(DEFAULTS, ()))


def options():
    """The launch options in effect here: the defaults, or the innermost :func:`tuning` block's."""
    return _CURRENT.get()[0]


#: ``state() -> (options, overrides key)`` in effect here: the context variable's own ``get`` (a call that runs no
#: Python frame, for the per-call lookups of bound calls).
state = _CURRENT.get


def overrides_key():
    """The overrides in effect, as a hashable key (``()`` under the defaults): launch caches include it."""
    return _CURRENT.get()[1]


@contextlib.contextmanager
def tuning(**overrides):
    """Override launch options for the code inside the ``with`` block (this thread or task only).

    Every option selects among launches that give the same result, so an override changes
    speed, never values; benchmarks, tests and tools use it to pin or sweep a launch.  Blocks
    nest, the inner one winning.  Launches planned inside the block are cached under its
    overrides, apart from the default ones.

    Parameters
    ----------
    **overrides
        Option names and values: the options, their defaults and the values each takes are
        tabled in the docs (Benchmarks, "Launch options"); ``tuning_options()`` lists them.

    Yields
    ------
    mapping
        The options in effect inside the block (read-only).

    Raises
    ------
    TypeError, ValueError
        For a name that is not an option, or a value the option does not take (checked here, when the
        block is entered: the error names the option and what it takes).  The options and their values
        are listed in the docs (``docs/guide/measuring.md``).

    Examples
    --------
    >>> import tcgnn_py as tg
    >>> with tg.tuning(vec_timed_choice=False) as opts:
    ...     opts["vec_timed_choice"]
    False
    >>> tg.tuning_options()["vec_timed_choice"]
    True
    """
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise TypeError(f"tuning() got unknown option(s) {unknown}; the options are {sorted(DEFAULTS)}")
    merged = dict(_CURRENT.get()[0])
    merged.update({name: _checked(name, value) for name, value in overrides.items()})
    key = tuple(sorted((k, v) for k, v in merged.items() if v != DEFAULTS[k] or type(v) is not type(DEFAULTS[k])))
    view = MappingProxyType(merged)
    token = _CURRENT.set((view, key))
    try:
        yield view
    finally:
        _CURRENT.reset(token)


# Building and reordering: small inputs take the NumPy path (same arrays, same permutation) instead of Numba
# kernels, whose first compile in a process costs seconds while a small input's NumPy pass costs ms.  -1: never on
# the host.
declare("build", {
    # a host input of up to this many entries: SGT on the host, one upload (past it, once compiled, the kernels
    # are the faster, launches and all)
    "sgt_host_max": (1 << 11, int_option(-1)),
    # ... and up to this many while the SGT kernels have not run in this process (a transpose too): their first
    # compile costs seconds, a host pass of 4M entries about half of one
    "sgt_host_cold_max": (1 << 22, int_option(-1)),
    # after this many such cold builds, the next one compiles the SGT kernels in a background thread, for the
    # builds after it (-1: never)
    "sgt_compile_after": (1, int_option(-1)),
    # a translation on the GPU of up to this many entries is one CTA's launch of the SGT kernels' work in order
    # (past it, the kernels' own launches: one CTA's phases are latency-bound, their time grows with the entries)
    "sgt_one_launch_max": (1 << 11, int_option(-1)),
    # gcn_norm / add_self_loops of a host graph on the host up to this many entries (or the translation's own
    # host limit, the larger): one upload, and a symmetric graph's tiling is checked there to be its own transpose
    "norm_host_max": (1 << 18, int_option(-1)),
    "nm_group_host_max": (1 << 16, int_option(-1)),  # ... and the N:M layouts' grouping too, up to this many
    "reorder_host_max": (1 << 14, int_option(-1)),  # reorder(A, N:M pattern), device=None: on the host up to this
    "locality_host_max": (1 << 16, int_option(-1)),  # reorder(A, "locality") / locality_report: the same
})
