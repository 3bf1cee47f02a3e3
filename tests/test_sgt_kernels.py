"""The Numba SGT kernels against the reference: in the simulator (CI) and on the GPU.

The same test runs both ways: ``xp`` is NumPy in the simulator (it takes host
arrays) and CuPy on a GPU.  Arrays must be identical, dtype included.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from _zoo import raw_with_duplicates, zoo
from conftest import SIM, host

from tcgnn_py import _reference as ref
from tcgnn_py import _sgt

pytestmark = pytest.mark.kernels

TINY = zoo("tiny")



def kernel_vs_reference(xp, A, tile_shape):
    A = sp.csr_array(A, dtype=np.float32)
    A.sum_duplicates()
    args = (A.data, A.indices.astype(np.int32), A.indptr.astype(np.int32))
    want = ref.translate(*args, A.shape, *tile_shape)
    got = _sgt.translate_kernels(xp, *(xp.asarray(a) for a in args), A.shape, *tile_shape)
    for key in want:
        g = host(got[key])
        assert g.dtype == want[key].dtype, key
        np.testing.assert_array_equal(g, want[key], err_msg=key)


@pytest.mark.parametrize("name", sorted(TINY))
def test_translate_tiny(xp, name):
    kernel_vs_reference(xp, TINY[name], (16, 8))


@pytest.mark.parametrize("tile_shape", [(16, 16), (8, 8), (32, 4), (4, 32), (1, 2)])
def test_translate_tile_shapes(xp, tile_shape):
    kernel_vs_reference(xp, TINY["n17"], tile_shape)


def test_translate_hub_window(xp):
    # A window whose first row holds many columns and whose other rows repeat some.
    n = 70 if SIM else 5000
    rows = np.r_[np.zeros(n - 1, int), np.arange(1, 16)]
    cols = np.r_[np.arange(1, n), np.arange(1, 16) * 3]
    A = sp.csr_array((np.ones(rows.size), (rows, cols)), shape=(n, n))
    kernel_vs_reference(xp, A, (16, 8))


def test_canonicalize_kernels(xp):
    arrays, shape = raw_with_duplicates(np.random.default_rng(7))
    data, indices, indptr = (a.astype(t) for a, t in zip(arrays, (np.float32, np.int32, np.int32)))
    want = ref.canonicalize_csr(data, indices, indptr, shape)
    got = _sgt.canonicalize_kernels(xp, *(xp.asarray(a) for a in (data, indices, indptr)), shape)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(host(g), w)
        assert host(g).dtype == w.dtype


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["n16k1", "rect_1000x37", "rect_37x1000", "star_100k"])
def test_translate_gpu_zoo(xp, name):
    kernel_vs_reference(xp, zoo("full")[name], (16, 8))
