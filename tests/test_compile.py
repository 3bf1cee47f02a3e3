"""Every Numba kernel compiles to PTX for sm_80 and sm_90 with NVVM -- no GPU needed.

The simulator accepts code the GPU compiler rejects; this catches it.
"""

import types

import pytest
from conftest import SIM

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
    from tcgnn_py.kernels import sgt

    return sgt.KERNELS


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)])
@pytest.mark.parametrize("name", ["rank_edges", "condense_edges", "count_block_rows", "scatter_edges", "sum_runs"])
def test_numba_kernel_compiles(fake_device, name, cc):
    from numba import cuda

    assert set(_kernels()) == {"rank_edges", "condense_edges", "count_block_rows", "scatter_edges", "sum_runs"}
    kernel, sig = _kernels()[name]
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=cc)
    assert f".target sm_{cc[0]}{cc[1]}" in ptx
    if name == "rank_edges":
        assert "vote.sync.ballot" in ptx and "shfl.sync.bfly" in ptx
    if name == "count_block_rows":
        assert "shfl.sync.up" in ptx
