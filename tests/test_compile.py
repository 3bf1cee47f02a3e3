"""Every Numba kernel compiles to PTX for sm_80 and sm_90 with NVVM -- no GPU needed.

The simulator accepts code the GPU compiler rejects; this catches it.
"""

import types

import pytest
from _env import SIM

pytest.importorskip("numba.cuda")
pytestmark = pytest.mark.skipif(SIM, reason="compile checks need the real Numba CUDA target")


@pytest.fixture
def fake_device(monkeypatch):
    # Device functions ask the current device's compute capability; pretend one.
    import numba.cuda.dispatcher as dispatcher

    monkeypatch.setattr(
        dispatcher, "get_current_device", lambda: types.SimpleNamespace(compute_capability=(9, 0))
    )


def _kernels():
    from tcgnn_py.kernels import locality, nm_windows, reorder, sample, sgt

    return {**sgt.KERNELS, **reorder.KERNELS, **locality.KERNELS, **nm_windows.KERNELS, **sample.KERNELS}


#: Warp intrinsics each kernel must compile to: the reason it exists in this form.
INTRINSICS = {
    "rank_edges": ("vote.sync.ballot", "shfl.sync.bfly"),
    "window_blocks": ("shfl.sync.bfly", "vote.sync.ballot", "popc", "atom.shared.add", "atom.global.max",
                      "atom.global.add"),
    "count_block_rows": ("shfl.sync.up",),
    "check_csr": ("atom.global.or",),
    "scan_tiles": ("shfl.sync.up",),
    "scan_tile_totals": ("shfl.sync.up",),
    "plan_units": ("shfl.sync.up", "bar.sync"),
    "plan_longest_first": ("shfl.sync.up", "match.any.sync", "popc", "bar.sync"),
    "translate_small": ("vote.sync.ballot", "shfl.sync.bfly", "shfl.sync.up", "atom.global.or", "atom.global.max",
                        "bar.sync"),
    "pack_bits": ("match.any.sync", "vote.sync.ballot"),
    "vector_codes": ("popc",),
    "count_meta_violations": ("vote.sync.ballot", "popc"),
    "stage2_round": ("vote.sync.ballot", "shfl.sync.idx", "popc"),
    "gains_batch": ("shfl.sync.idx", "popc"),
    "best_partner": ("shfl.sync.bfly",),
    "group_windows": ("shfl.sync.bfly", "vote.sync.ballot", "shfl.sync.idx"),
}
NAMES = [
    "check_csr", "rank_edges", "window_blocks", "condense_edges", "count_block_rows", "scatter_edges", "block_meta", "sum_runs",
    "scan_tile_totals", "scan_tiles", "translate_small", "plan_units", "csr_of_order", "plan_longest_first",
    "transpose_count", "transpose_place", "transpose_rank",
    "pack_bits", "vector_codes", "count_meta_violations", "stage2_round", "gains_batch",
    "best_partner", "group_windows", "sample_rows", "place_slots", "sample_mark_rows", "hop_sources", "hop_rows",
]  # fmt: skip


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
@pytest.mark.parametrize("name", NAMES)
def test_numba_kernel_compiles(fake_device, name, cc):
    from numba import cuda

    assert set(_kernels()) == set(NAMES)
    kernel, sig = _kernels()[name]
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=cc)
    assert f".target sm_{cc[0]}{cc[1]}" in ptx
    for instruction in INTRINSICS.get(name, ()):
        assert instruction in ptx, instruction
