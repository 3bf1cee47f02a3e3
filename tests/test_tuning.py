"""``tcgnn_py.tuning``: launch options overridden inside a ``with`` block only, per thread, keyed for caches."""

import pathlib
import re
import threading

import numpy as np
import pytest

import tcgnn_py as tg
from tcgnn_py import _tuning


def test_defaults_outside_any_block():
    assert dict(tg.tuning_options()) == dict(_tuning.DEFAULTS)
    assert _tuning.overrides_key() == ()


def test_block_overrides_then_restores():
    with tg.tuning(vec_coop=True, vec_max_slices=1) as opts:
        assert opts["vec_coop"] is True and tg.tuning_options()["vec_max_slices"] == 1
        assert dict(_tuning.overrides_key()) == {"vec_coop": True, "vec_max_slices": 1}
        with tg.tuning(vec_max_slices=2):  # inner block wins, back to the default: not an override
            assert dict(_tuning.overrides_key()) == {"vec_coop": True}
        assert tg.tuning_options()["vec_max_slices"] == 1
    assert tg.tuning_options()["vec_coop"] is None and _tuning.overrides_key() == ()


def test_restored_after_an_exception():
    with pytest.raises(RuntimeError):
        with tg.tuning(vec_warps=2):
            raise RuntimeError
    assert tg.tuning_options()["vec_warps"] == 4


def test_options_are_read_only():
    with pytest.raises(TypeError):
        tg.tuning_options()["vec_warps"] = 8


def test_unknown_option_names_it():
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['vec_wraps'\]"):
        with tg.tuning(vec_wraps=8):
            pass


def test_values_are_normalised_so_the_default_keeps_its_cache():
    """NumPy's bool and int for Python's (and a list for a pair) mean the same launch: the default's cache key."""
    with tg.tuning(vec_combine=np.True_, vec_warps=np.int64(4)) as opts:
        assert _tuning.overrides_key() == ()
        assert type(opts["vec_combine"]) is bool and type(opts["vec_warps"]) is int
    with tg.tuning(tf32_nwarps=[4, 2]) as opts:
        assert opts["tf32_nwarps"] == (4, 2)
        assert _tuning.overrides_key() == (("tf32_nwarps", (4, 2)),)


def test_other_threads_keep_the_defaults():
    seen = {}
    with tg.tuning(vec_warps=2):
        t = threading.Thread(target=lambda: seen.update(tg.tuning_options()))
        t.start()
        t.join()
    assert seen["vec_warps"] == 4


def test_every_option_belongs_to_one_family():
    names = [k for fam in _tuning.FAMILY_DEFAULTS.values() for k in fam]
    assert len(names) == len(set(names)) == len(_tuning.DEFAULTS)


def test_launch_keys_follow_the_overrides():
    from tcgnn_py.products import _launch as _launches

    plain = _launches.launch_key("tf32", "float32", 64, True)
    with tg.tuning(vec_max_slices=1):
        assert _launches.launch_key("tf32", "float32", 64, True) != plain
    assert _launches.launch_key("tf32", "float32", 64, True) == plain


BAD = [  # (option, value, error): each was accepted before it was checked where the block is entered
    ("vec_warps", -1, ValueError), ("vec_warps", 8, ValueError), ("vec_kernel", "nonsense", ValueError),
    ("tf32_nwarps", [4, 4, 4], ValueError), ("tf32_nwarps", (9, 4), ValueError), ("tf32_nwarps", "44", TypeError),
    ("core_nwarps", 0.5, TypeError), ("core_nwarps", 0, ValueError), ("vec_timed_choice", "yes", TypeError),
    ("vec_timed_choice", 1, TypeError), ("vec_coop", "no", TypeError), ("vec_max_slices", 3, ValueError),
    ("vec_tail_factor", float("nan"), ValueError), ("vec_tail_factor", "4", TypeError),
    ("sgt_host_max", -2, ValueError), ("sgt_host_max", 1.5, TypeError), ("half_kernel", "x", TypeError),
    ("tf32_kernel", 3, ValueError), ("vec_blocks_per_unit", 0, ValueError), ("blocks_per_warp", True, TypeError),
]


@pytest.mark.parametrize("name,value,error", BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_a_value_the_option_does_not_take_is_refused_by_name(name, value, error):
    with pytest.raises(error, match=f"tuning option {name} takes .*, got "):
        with tg.tuning(**{name: value}):
            pass
    assert tg.tuning_options()[name] == _tuning.DEFAULTS[name]


def test_every_default_is_a_value_its_option_takes():
    with tg.tuning(**dict(_tuning.DEFAULTS)):
        assert _tuning.overrides_key() == ()
    assert set(_tuning.allowed()) == set(_tuning.DEFAULTS)


def test_the_warp_limits_are_the_kernels_launch_bounds():
    """``vec_warps``, ``tf32_nwarps`` and ``core_nwarps`` stop at each SpMM kernel's ``__launch_bounds__``."""
    from tcgnn_py.kernels import products as kp

    from tcgnn_py.products.families import core, tf32, vec

    limits = {"vec": vec.MAX_WARPS, "tf32": tf32.MAX_WARPS, "core": core.MAX_WARPS}
    src = pathlib.Path(kp.__file__).parent
    kernels = {"vec": ("vec.py", ["tcgnn_spmm_vec", "tcgnn_spmm_vec_async"]), "half": ("half.py", ["tcgnn_spmm_vech"]),
               "tf32": ("tf32.py", ["tcgnn_spmm_tf32", "tcgnn_spmm_tf32_async"]), "core": ("core.py", ["tcgnn_spmm_core"])}
    for family, (path, names) in kernels.items():
        text = (src / path).read_text()
        for name in names:
            m = re.search(r"__launch_bounds__\((\d+)[^)]*\)*\s*\n" + name + r"\(", text)
            assert m, (family, name)
            assert int(m.group(1)) == 32 * limits["vec" if family == "half" else family], name
    assert _tuning.allowed()["vec_warps"] == f"an int in [1, {limits['vec']}]"
    assert _tuning.allowed()["core_nwarps"] == f"an int in [1, {limits['core']}]"
    assert f"[1, {limits['tf32']}]" in _tuning.allowed()["tf32_nwarps"]


def test_the_host_translation_limit_is_the_larger_one_until_the_kernels_have_run(monkeypatch):
    """Host inputs: ``sgt_host_max``, or ``sgt_host_cold_max`` while the SGT kernels have not run; transposes of
    device tilings: the cold limit only while they have not; ``sgt_host_max=-1``: never on the host."""
    from tcgnn_py.tiles import _sgt

    small, cold = 1 << 11, 1 << 22  # the defaults
    monkeypatch.setattr(_sgt, "_RAN", [False])
    assert (_sgt.host_limit(), _sgt.host_limit(device_input=True)) == (cold, cold)
    with tg.tuning(sgt_host_cold_max=-1):
        assert (_sgt.host_limit(), _sgt.host_limit(device_input=True)) == (small, -1)
    with tg.tuning(sgt_host_max=-1):
        assert (_sgt.host_limit(), _sgt.host_limit(device_input=True)) == (-1, -1)
    monkeypatch.setattr(_sgt, "_RAN", [True])
    assert (_sgt.host_limit(), _sgt.host_limit(device_input=True)) == (small, -1)


def test_the_second_build_on_the_host_only_because_the_kernels_are_cold_compiles_them_behind(monkeypatch):
    """``on_host``: the host limits decide; builds that go to the host only because the kernels have not run (above
    ``sgt_host_max``, or any transpose) are counted, and the one after the first ``sgt_compile_after`` starts
    their background compile (-1: none does); a small build, or one past the limits, is not counted."""
    from tcgnn_py.tiles import _sgt

    started = []
    monkeypatch.setattr(_sgt, "warm_kernels", lambda: started.append(1))
    monkeypatch.setattr(_sgt, "_RAN", [False])
    small, cold = 1 << 11, 1 << 22
    monkeypatch.setattr(_sgt, "_WARMING", {})
    cases = [(small, False, True, 0), (cold + 1, False, False, 0), (cold + 1, True, False, 0),
             (small + 1, False, True, 0), (cold, False, True, 1), (1, True, True, 2)]
    for nnz, device_input, host, starts in cases:
        assert (_sgt.on_host(nnz, device_input), len(started)) == (host, starts), (nnz, device_input)
    for after, want in ((0, 1), (1, 0), (2, 0), (-1, 0)):
        monkeypatch.setattr(_sgt, "_WARMING", {})
        started.clear()
        with tg.tuning(sgt_compile_after=after):
            assert _sgt.on_host(small + 1) and len(started) == want, after
    with tg.tuning(sgt_compile_after=-1):
        assert _sgt.on_host(1, device_input=True) and _sgt.on_host(1, device_input=True) and len(started) == 0
    monkeypatch.setattr(_sgt, "_RAN", [True])
    started.clear()
    assert (_sgt.on_host(small), _sgt.on_host(small + 1), _sgt.on_host(1, True), started) == (True, False, False, [])
