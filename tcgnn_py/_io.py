"""Layer 3: loading graphs -- the bundled Cora and the shared data layout."""

import dataclasses
import os
from importlib import resources

import numpy as np

from .orders import Permutation

__all__ = ["Graph", "load_cora", "load_graph"]


@dataclasses.dataclass
class Graph:
    """A graph as loaded from disk: adjacency plus whatever else the folder holds."""

    name: str
    adj: object  # scipy.sparse.csr_array
    features: object = None  # scipy.sparse.csr_array, or None
    labels: np.ndarray = None
    train_idx: np.ndarray = None
    val_idx: np.ndarray = None
    test_idx: np.ndarray = None
    #: The :class:`~tcgnn_py.Permutation` that :meth:`permute` applied (None: the loaded order).
    permutation: object = None

    def permute(self, perm):
        """The same graph with its vertices renumbered: every per-vertex field moves together.

        ``perm`` is a :class:`~tcgnn_py.Permutation` (e.g. from
        ``tg.reorder(g.adj, "locality")``) or an array-like ``perm[new] = old``
        (made into one): the adjacency becomes
        ``perm.apply(adj)``, feature rows and labels follow their vertices, and
        the split indices name the same vertices by their new ids (sorted).
        Reorder once, train in the new order, and map per-vertex results back
        with ``perm.undo_rows(Y)`` (``g.permutation`` keeps ``perm``).

        Examples
        --------
        >>> import numpy as np, tcgnn_py as tg
        >>> g = tg.load_cora()
        >>> p = tg.reorder(g.adj, "locality", device="cpu")
        >>> h = g.permute(p)
        >>> bool((h.labels[p.inverse_perm] == g.labels).all())
        True
        >>> sorted(p.perm[h.train_idx]) == sorted(g.train_idx)
        True
        """
        if not (hasattr(perm, "inverse_perm") and hasattr(perm, "apply")):
            perm = Permutation(perm)
        if len(perm) != self.adj.shape[0]:
            raise ValueError(f"permute: perm has {len(perm)} entries for {self.adj.shape[0]} vertices")
        if self.permutation is not None:
            raise ValueError("permute: this graph is already permuted; permute the original (nothing would map back)")
        inv = perm.inverse_perm

        def rows(x):
            return None if x is None else perm.apply_rows(x)

        def ids(idx):
            return None if idx is None else np.sort(inv[np.asarray(idx)]).astype(np.asarray(idx).dtype)

        return dataclasses.replace(
            self, adj=perm.apply(self.adj), features=rows(self.features), labels=rows(self.labels),
            train_idx=ids(self.train_idx), val_idx=ids(self.val_idx), test_idx=ids(self.test_idx), permutation=perm,
        )  # fmt: skip


def _sparse_archive(f, where):
    """The scipy sparse matrix saved in ``f`` (``scipy.sparse.save_npz``'s format) as a csr_array, or a
    ``ValueError`` that says ``where`` is not one (never an unsafe load: the archive holds arrays only)."""
    import zipfile

    import scipy.sparse as sp

    try:
        return sp.csr_array(sp.load_npz(f))
    except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"{where} is not a graph archive (a sparse matrix saved by scipy.sparse.save_npz): "
                         f"{type(e).__name__}") from None


def _load_folder(name, opener):
    def npz(fname):
        with opener(fname) as f:
            return _sparse_archive(f, f"{name}/{fname}")

    def npy(fname):
        try:
            with opener(fname) as f:
                return np.load(f)
        except FileNotFoundError:
            return None

    try:
        features = npz("features_csr.npz")
    except FileNotFoundError:
        features = None
    return Graph(
        name=name,
        adj=npz("adj_csr.npz"),
        features=features,
        labels=npy("labels.npy"),
        train_idx=npy("train_idx.npy"),
        val_idx=npy("val_idx.npy"),
        test_idx=npy("test_idx.npy"),
    )


def load_cora():
    """The Cora citation graph bundled with the package (Planetoid split).

    2,708 nodes, 10,556 stored entries (symmetric, binary), 1,433 sparse
    features, 7 classes.

    Examples
    --------
    >>> import tcgnn_py as tg
    >>> g = tg.load_cora()
    >>> g.adj.shape, g.adj.nnz, len(g.train_idx)
    ((2708, 2708), 10556, 140)
    """
    root = resources.files("tcgnn_py") / "datasets" / "cora"
    return _load_folder("cora", lambda f: (root / f).open("rb"))


def load_graph(path):
    """Load a graph folder (``adj_csr.npz`` [+ features, labels, split]), an ``.npz`` or an ``.mtx`` (any case).

    ``"cora"``, where no such folder or file exists, is the bundled graph (:func:`load_cora`).  A file that is not a
    sparse matrix saved by ``scipy.sparse.save_npz`` raises ``ValueError``.

    Examples
    --------
    >>> import tcgnn_py as tg
    >>> tg.load_graph("no/such/graph")
    Traceback (most recent call last):
    ...
    FileNotFoundError: no graph at 'no/such/graph': expected a folder holding adj_csr.npz, an .npz or an .mtx file (only cora ships with the package: tg.load_cora())
    """
    import scipy.io
    import scipy.sparse as sp

    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}") from None
    name = os.path.basename(os.path.normpath(path))
    suffix = os.path.splitext(path)[1].lower()
    if os.path.isdir(path):
        return _load_folder(name, lambda f: open(os.path.join(path, f), "rb"))
    if suffix == ".npz" and os.path.isfile(path):
        return Graph(name=name[:-4], adj=_sparse_archive(path, repr(path)))
    if suffix == ".mtx" and os.path.isfile(path):
        return Graph(name=name[:-4], adj=sp.csr_array(scipy.io.mmread(path)))
    if path == "cora":
        return load_cora()
    raise FileNotFoundError(
        f"no graph at {path!r}: expected a folder holding adj_csr.npz, an .npz or an .mtx file "
        "(only cora ships with the package: tg.load_cora())"
    )
