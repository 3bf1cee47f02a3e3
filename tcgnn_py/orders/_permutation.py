"""Layer 0: :class:`Permutation`, a vertex renumbering and how it moves matrices and rows."""

import numpy as np

from .._device import array_module, to_host
from ._nm_reference import permute_csr
from .._validation import check_csr_arrays, coerce_csr

__all__ = ["Permutation"]


class Permutation:
    """A vertex renumbering: ``perm[new] = old``.

    ``apply(A)`` is ``P A P^T`` (``B[i, j] = A[perm[i], perm[j]]``): the same
    graph with renumbered vertices, so a symmetric matrix stays symmetric.
    ``apply_rows(X)`` renumbers node features, ``undo_rows(Y)`` brings results
    back: ``undo_rows(apply(A) @ apply_rows(X)) == A @ X``.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, tcgnn_py as tg
    >>> p = tg.Permutation([2, 0, 1])
    >>> A = sp.csr_array(np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]]))
    >>> p.apply(A).toarray()
    array([[0, 0, 1],
           [0, 0, 1],
           [1, 1, 0]])
    >>> X = np.arange(3.0)
    >>> p.undo_rows(p.apply(A) @ p.apply_rows(X)).tolist() == (A @ X).tolist()
    True
    """

    def __init__(self, perm, *, pattern=None, report=None):
        perm = np.asarray(to_host(perm))
        if perm.size == 0 and perm.ndim == 1:
            perm = perm.astype(np.int64)  # the permutation of no vertices (np.asarray([]) is float64)
        if perm.ndim != 1 or perm.dtype.kind not in "iu":
            raise ValueError(f"a permutation is a 1-D array of integers, got a {perm.ndim}-D array of {perm.dtype}")
        perm = perm.astype(np.int64)
        n = perm.shape[0]
        seen = np.zeros(n, bool)
        if n and (perm.min() < 0 or perm.max() >= n):
            raise ValueError(f"permutation entries must be in [0, {n})")
        seen[perm] = True
        if not seen.all():
            raise ValueError("not a permutation: some vertex occurs twice")
        perm.flags.writeable = False
        self.perm = perm
        self.pattern = pattern
        self.report = report
        self._inv = None
        self._device = {}

    def __len__(self):
        return self.perm.shape[0]

    def __eq__(self, other):
        """Equal when both renumber the vertices the same way (``perm``); how each was found is not compared."""
        if not isinstance(other, Permutation):
            return NotImplemented
        return bool(np.array_equal(self.perm, other.perm))

    def __hash__(self):
        return hash(self.perm.tobytes())  # (perm is read-only: the hash never changes)

    def __repr__(self):
        return f"<Permutation of {len(self)} vertices" + (f", {self.report}>" if self.report else ">")

    @property
    def inverse_perm(self):
        if self._inv is None:
            inv = np.empty_like(self.perm)
            inv[self.perm] = np.arange(len(self))
            inv.flags.writeable = False
            self._inv = inv
        return self._inv

    def inverse(self):
        """The permutation that undoes this one."""
        return Permutation(self.inverse_perm)

    def _index(self, x, inverse=False):
        arr = self.inverse_perm if inverse else self.perm
        if array_module(x) is np:
            return arr
        key = (inverse, x.device.id)
        if key not in self._device:
            self._device[key] = array_module(x).asarray(arr)
        return self._device[key]

    def _check_rows(self, X, what):
        if not (hasattr(X, "shape") and hasattr(X, "ndim")):
            X = np.asarray(X)  # any array-like: a list becomes a NumPy array
        if X.ndim < 1 or X.shape[0] != len(self):
            raise ValueError(f"{what}: expected {len(self)} rows, got shape {X.shape}")
        return X

    def apply_rows(self, X):
        """``X[perm]``: rows (node features) in the new order; NumPy, CuPy or any array-like."""
        X = self._check_rows(X, "apply_rows")
        return X[self._index(X)]

    def undo_rows(self, Y):
        """``Y[inverse_perm]``: rows of a result back in the original order."""
        Y = self._check_rows(Y, "undo_rows")
        return Y[self._index(Y, inverse=True)]

    def apply(self, A):
        """``P A P^T`` of a square sparse matrix, in A's format and class.

        Every stored entry keeps its value (explicit zeros included); only the
        vertex ids change.  scipy and cupyx sparse inputs are accepted.
        """
        data, indices, indptr, shape = coerce_csr(A, (len(self),) * 2 if isinstance(A, tuple) else None)
        if shape != (len(self), len(self)):
            raise ValueError(f"apply: expected a {len(self)}x{len(self)} matrix, got {shape}")
        # The same checks and wording as TiledMatrix: a negative index would wrap around silently.
        data, indices, indptr = check_csr_arrays(data, indices, indptr, shape, full_check=True)
        perm = self._index(indices)
        if array_module(indices) is not np:
            perm = perm.astype(indices.dtype)
        arrays = permute_csr(data, indices, indptr, perm)
        if isinstance(A, tuple):
            return arrays
        out = A.tocsr().__class__(arrays, shape=shape)
        return out if A.format == "csr" else out.asformat(A.format)
