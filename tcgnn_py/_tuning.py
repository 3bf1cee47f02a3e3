"""Layer 0: launch options of the product kernels, each family's defaults, overridden only inside ``with tuning(...)``.

The options choose among launches that all give the same bits (the partition of the work, the
launch shape, which compiled variant runs), so they change speed only.  There is no global
setting to mutate: :func:`tuning` overrides options for the code inside its ``with`` block, in
this thread (and asyncio task) only, and a launch planned under overrides is cached under them,
so the default launches are never replaced by an experiment's.
"""

import contextlib
import contextvars
import math
import numbers
import operator
from types import MappingProxyType

__all__ = ["tuning", "options", "overrides_key", "FAMILY_DEFAULTS", "DEFAULTS", "allowed", "declare_check",
           "MAX_WARPS"]

#: Each kernel family's launch options and their defaults (the rule behind a default is in the
#: code that reads it; ``None`` means "from the tiling's statistics").
FAMILY_DEFAULTS = MappingProxyType({
    # 16x8 TF32 SpMM (tcgnn_spmm_tf32 / its cp.async form)
    "tf32": MappingProxyType({
        # the kernel: a config of kernels.products.TF32_SPMM_CONFIGS; None: tf32_spmm_config by width and alignment
        "tf32_kernel": None,
        "tf32_nwarps": None,  # warps per CTA for 1, 2 chunks, e.g. (4, 4)
        "blocks_per_warp": None,  # a unit holds up to nwarps * this many blocks
    }),
    # CUDA-core SpMM (any tile shape, exact float64)
    "core": MappingProxyType({
        "core_nwarps": 4,
    }),
    # vector layout, TF32 and 16-bit: the balanced units and the grid
    "vec": MappingProxyType({
        # the kernel: a config of kernels.products.VEC_SPMM_CONFIGS (no timed choice then; cp.async configs fall
        # back to the rule's on rows cp.async cannot copy); None: the statistics' rule and the timed choice
        "vec_kernel": None,
        "vec_max_slices": 2,  # the statistics' cap on float4 groups per lane (a warp covers 32 * this many features)
        "vec_blocks_per_unit": None,  # blocks per balanced unit
        "vec_target_warps": 16,  # aim for this many warps per SM in the grid
        "vec_tail_factor": 4,  # longest unit <= this x the blocks per resident warp (None: no cap)
        "vec_tail_floor": 128,  # and <= max(the blocks per resident warp, this) (None: no such cap)
        "vec_warps": 4,  # warps per CTA (independent: each takes its own unit x slice)
        "vec_sort_units": True,  # longest units first: the grid's tail is made of short ones
        "vec_coop": None,  # one CTA per window x slice; None: by the grid
        "vec_coop_chain": 1,  # by the grid only where a quarter of the longest window is <= this many units
        "vec_combine": True,  # sum split windows inside the launch (else: the fixup launch)
        "vec_combine_parts_max": 64,  # ... when no window has more parts than this
        # time the bit-identical launches once and keep the fastest; it overrides the combine option (False
        # pins it)
        "vec_timed_choice": True,
    }),
    # vector layout, 16-bit X
    "half": MappingProxyType({
        "half_tail_floor": 64,  # vec_tail_floor for 16-bit blocks (half the bytes: shorter units pay)
        # the kernel's shape: a kernels.products.SpmmVech whose (FS, KS, NS, COMBINE, COOP) are compiled (its
        # types and alignment come from the operands; no timed choice then); None: the rule and the timed choice
        "half_kernel": None,
        # values X's type holds exactly (unweighted, small integers): one MMA, not two on (hi, lo) pairs
        "half_exact_values": True,
    }),
    # building and reordering: small inputs take the NumPy path (same arrays, same permutation) instead of
    # Numba kernels, whose first compile in a process costs seconds while a small input's NumPy pass costs ms
    "build": MappingProxyType({
        "sgt_host_max": 1 << 18,  # host input of up to this many entries: SGT on the host, then one upload
        # ... and up to this many while the SGT kernels have not run in this process (a transpose too): their
        # first compile costs seconds, a host pass of 2M entries a few tenths of one
        "sgt_host_cold_max": 1 << 21,
        "nm_group_host_max": 1 << 16,  # ... and the N:M layouts' grouping too, up to this many
        "reorder_host_max": 1 << 14,  # reorder(A, N:M pattern) with device=None: on the host up to this many
        "locality_host_max": 1 << 16,  # reorder(A, "locality") / locality_report with device=None: the same
    }),
    # N:M layouts, mma.sp
    "sparse": MappingProxyType({
        "sp_blocks_per_unit": 32,  # blocks per balanced unit (the reorder's NM_BLOCKS_PER_UNIT)
    }),
})

#: Every option and its default, all families together (option names are unique across families).
DEFAULTS = MappingProxyType({k: v for fam in FAMILY_DEFAULTS.values() for k, v in fam.items()})

#: Warps per CTA each launch option may ask for: the kernels' ``__launch_bounds__`` (the vector SpMM is compiled
#: for 128 threads, the 16x8 and CUDA-core SpMM for 256); a larger block fails at the driver with an error that
#: names nothing.  ``tests/test_tuning.py`` checks these numbers against the kernel sources.
MAX_WARPS = MappingProxyType({"vec": 4, "tf32": 8, "core": 8})


def _int(lo, hi=None, none=False):
    """A check for an int option in ``[lo, hi]`` (``None`` allowed where ``none``), and what it takes."""
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


def _bool(none=False):
    def check(value):
        if value is None and none:
            return None
        if type(value).__name__ not in ("bool", "bool_"):  # bool or numpy.bool_
            raise TypeError
        return bool(value)

    return check, "True or False" + (" or None" if none else "")


def _positive_number(none=False):
    def check(value):
        if value is None and none:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError
        if not (math.isfinite(value) and value > 0):
            raise ValueError
        return value

    return check, "a finite number > 0" + (" or None" if none else "")


def _warp_pair(family):
    hi = MAX_WARPS[family]

    def check(value):
        if value is None:
            return None
        if isinstance(value, (str, bytes)):
            raise TypeError
        pair = tuple(value)
        if len(pair) != 2:
            raise ValueError
        return tuple(_int(1, hi)[0](v) for v in pair)

    return check, f"None or a pair of ints in [1, {hi}] (warps per CTA for 1 and 2 chunks), e.g. (4, 4)"


def _pending(takes):
    """A config option whose compiled set the kernels declare (:func:`declare_check`); until then, None only."""
    def check(value):
        if value is not None:
            raise ValueError
        return None

    return check, takes


_CHECKS = {
    "tf32_kernel": _pending("None or a config of kernels.products.TF32_SPMM_CONFIGS"),
    "tf32_nwarps": _warp_pair("tf32"),
    "blocks_per_warp": _int(1, none=True),
    "core_nwarps": _int(1, MAX_WARPS["core"]),
    "vec_kernel": _pending("None or a config of kernels.products.VEC_SPMM_CONFIGS"),
    "vec_max_slices": _int(1, 2),
    "vec_blocks_per_unit": _int(1, none=True),
    "vec_target_warps": _int(1),
    "vec_tail_factor": _positive_number(none=True),
    "vec_tail_floor": _int(1, none=True),
    "vec_warps": _int(1, MAX_WARPS["vec"]),
    "vec_sort_units": _bool(),
    "vec_coop": _bool(none=True),
    "vec_coop_chain": _int(0),
    "vec_combine": _bool(),
    "vec_combine_parts_max": _int(0),
    "vec_timed_choice": _bool(),
    "half_tail_floor": _int(1, none=True),
    "half_kernel": _pending("None or a kernels.products.SpmmVech whose (FS, KS, NS) is in VEC_HALF (COOP: "
                            "VEC_HALF_COOP)"),
    "half_exact_values": _bool(),
    # -1: never on the host
    "sgt_host_max": _int(-1),
    "sgt_host_cold_max": _int(-1),
    "nm_group_host_max": _int(-1),
    "reorder_host_max": _int(-1),
    "locality_host_max": _int(-1),
    "sp_blocks_per_unit": _int(1),
}
assert set(_CHECKS) == set(DEFAULTS), "every option has its check"


def declare_check(name, check, takes):
    """Set the check of a config option, from the module that knows its compiled set (the kernels declare theirs).

    ``check(value)`` returns the value to use or raises ``TypeError`` / ``ValueError``; ``takes`` says what the
    option takes, in the error's words.
    """
    if name not in DEFAULTS:
        raise KeyError(name)
    _CHECKS[name] = (check, takes)


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
