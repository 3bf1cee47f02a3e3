"""``tcgnn_py.tuning``: launch options overridden inside a ``with`` block only, per thread, keyed for caches."""

import threading

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
        with tg.tuning(vec_warps=8):
            raise RuntimeError
    assert tg.tuning_options()["vec_warps"] == 4


def test_options_are_read_only():
    with pytest.raises(TypeError):
        tg.tuning_options()["vec_warps"] = 8


def test_unknown_option_names_it():
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['vec_wraps'\]"):
        with tg.tuning(vec_wraps=8):
            pass


def test_a_value_equal_but_of_another_type_is_an_override():
    """``1`` for ``True`` (or ``2.0`` for ``2``) may take another code path: it must not share the default's cache."""
    with tg.tuning(vec_combine=1):
        assert _tuning.overrides_key() == (("vec_combine", 1),)


def test_other_threads_keep_the_defaults():
    seen = {}
    with tg.tuning(vec_warps=8):
        t = threading.Thread(target=lambda: seen.update(tg.tuning_options()))
        t.start()
        t.join()
    assert seen["vec_warps"] == 4


def test_every_option_belongs_to_one_family():
    names = [k for fam in _tuning.FAMILY_DEFAULTS.values() for k in fam]
    assert len(names) == len(set(names)) == len(_tuning.DEFAULTS)


def test_launch_keys_follow_the_overrides():
    from tcgnn_py import _launches

    plain = _launches.launch_key("tf32", "float32", 64, True)
    with tg.tuning(vec_max_slices=1):
        assert _launches.launch_key("tf32", "float32", 64, True) != plain
    assert _launches.launch_key("tf32", "float32", 64, True) == plain
