"""The NumPy reference (layer 0) on its own: exact sums, the bundled data, a light import."""

import numpy as np

import tcgnn_py as tg
from tcgnn_py import _reference as ref


def test_bundled_cora():
    g = tg.load_cora()
    assert g.adj.shape == (2708, 2708) and g.adj.nnz == 10556
    assert g.features.shape == (2708, 1433) and g.labels.shape == (2708,)
    assert (len(g.train_idx), len(g.val_idx), len(g.test_idx)) == (140, 500, 1000)


def test_reference_sum_runs_is_sequential():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    acc = np.float32(0)
    for v in x[3:1000]:
        acc = np.float32(acc + v)
    got = ref.sum_runs(x, np.array([0, 3]))
    assert got[1] == acc and got[0] == np.float32(np.float32(x[0] + x[1]) + x[2])


def test_import_is_light():
    import subprocess
    import sys

    code = "import sys, tcgnn_py; print('numba' in sys.modules, 'cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_power_law_graph_arguments():
    import pytest

    for args, error, message in [((-5, 10), ValueError, "n_nodes must be >= 1"), ((0, 0), ValueError, "n_nodes"),
                                 ((10, -1), ValueError, "n_edges must be >= 0"), ((10, 101), ValueError, "n_edges"),
                                 ((10.5, 3), TypeError, "n_nodes must be an int")]:
        with pytest.raises(error, match=message):
            tg.power_law_graph(*args)
    assert tg.power_law_graph(1, 1).nnz == 1


def test_seed_streams_are_splitmix64():
    """The device seed stream's reference: draw c of key k is splitmix64's output for the state k + c * golden
    (so key 0 gives splitmix64's published sequence from seed 0), its low word first."""
    from tcgnn_py._reference import seed_stream

    got = seed_stream(0, 2, 2)
    assert [int(got[0, 0]) | int(got[0, 1]) << 32, int(got[1, 0]) | int(got[1, 1]) << 32] == [
        0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]
    np.testing.assert_array_equal(seed_stream(0, 2, 1), got[:, :1])
