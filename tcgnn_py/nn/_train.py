"""Layer 4: a full-batch training loop for node classification (Planetoid-style splits)."""

import dataclasses
import time

import numpy as np

from ._edges import array_on, edges_of
from .._validation import as_dtype, is_half
from ._layers import cross_entropy
from .._capture import CUDAGraph

__all__ = ["TrainResult", "train"]


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` measured.

    ``test_acc`` is the test accuracy at the epoch of best validation accuracy
    (model selection on the validation split, as PyTorch Geometric's examples
    report); ``final_test_acc`` is the last epoch's.  ``epoch_times`` are the
    seconds of each training step (forward, loss, backward, optimizer): CUDA
    events on the GPU, the host clock on the CPU.
    """

    test_acc: float
    val_acc: float
    best_epoch: int
    final_test_acc: float
    final_loss: float
    epoch_times: list

    @property
    def epoch_time(self):
        """Median seconds per training epoch."""
        return float(np.median(self.epoch_times)) if self.epoch_times else float("nan")


def train(apply, params, A, X, labels, split, optimizer, *, epochs=200, rng=None, dropout_p=0.5,
          precision=None, evaluate=True, dtype=None, loss_scale=1.0, cuda_graph=False):
    """Train ``apply`` (e.g. :func:`gcn_apply`) full-batch with ``optimizer``; return a :class:`TrainResult`.

    Parameters
    ----------
    apply : callable
        ``apply(params, A, X, rng=, dropout_p=, training=, precision=) -> (logits, vjp)``.
    params : dict
        Updated in place (through ``optimizer``, which must hold them).
    A, X : the graph (a TiledMatrix) and the node features (moved to A's device).
    labels : int array, shape (n,)
    split : (train_idx, val_idx, test_idx)
    optimizer : :class:`Adam`
    epochs : int, default 200
    rng : Generator
        For dropout, on A's device (:func:`default_rng`).
    evaluate : bool, default True
        Score the validation and test splits after every epoch (on the
        device, read once at the end); False times training alone.
    dtype : {None, "float16", "bfloat16"}, optional
        Mixed precision: ``apply(..., dtype=dtype)`` runs in 16 bits (see
        :func:`gcn_apply`), the loss and the optimizer step in float32.
    loss_scale : float, default 1.0
        The loss gradient is multiplied by it before the backward pass and
        the gradients divided by it in float32 (a static loss scale, for
        float16 gradients that would underflow; not needed on Cora).
    cuda_graph : bool, default False
        Run the first epoch as usual, capture one training step (and one
        evaluation) as CUDA graphs (:class:`tcgnn_py.CUDAGraph`), and replay
        them for the other epochs: one launch per step instead of a hundred,
        which is what small graphs are bound by.  The results are those of
        the eager loop, bit for bit (dropout masks and Adam's step count
        advance on the device).  GPU only.

    Examples
    --------
    >>> import numpy as np, tcgnn_py as tg
    >>> g = tg.load_cora()
    >>> A, X = tg.nn.gcn_norm(g.adj), g.features.toarray().astype(np.float32)
    >>> rng = tg.nn.default_rng(0, like=A)
    >>> params = tg.nn.gcn_init((X.shape[1], 16, 7), rng)
    >>> opt = tg.nn.Adam(params, lr=0.01, weight_decay={"W0": 5e-4, "b0": 5e-4})
    >>> r = tg.nn.train(tg.nn.gcn_apply, params, A, X, g.labels,
    ...                 (g.train_idx, g.val_idx, g.test_idx), opt, epochs=20, rng=rng)
    >>> 0.5 < r.test_acc <= 1 and len(r.epoch_times) == 20
    True
    """
    E = edges_of(A, precision)
    xp = E.xp
    X = array_on(E, X)
    amp = {} if dtype is None else {"dtype": dtype}  # apply functions without mixed precision keep working
    if dtype is not None:
        X = X.astype(as_dtype(dtype), copy=False)  # once, not per epoch
    labels = xp.asarray(labels)
    if labels.shape != (E.shape[0],):
        raise ValueError(f"labels has {labels.size} entries, the graph has {E.shape[0]} nodes"
                         + ("" if labels.ndim == 1 else f" (labels must be 1-D, got shape {labels.shape})"))
    train_idx, val_idx, test_idx = (xp.asarray(i) for i in split)
    on_device = xp is not np
    if cuda_graph and not on_device:
        raise ValueError("cuda_graph=True needs the graph on the GPU")

    def step():
        logits, vjp = apply(params, E, X, rng=rng, dropout_p=dropout_p, training=True, **amp)
        if is_half(logits.dtype):
            logits = logits.astype(np.float32)  # the loss in float32, as AMP does
        loss, dlogits = cross_entropy(logits, labels, train_idx)
        if loss_scale != 1.0:
            s = dlogits.dtype.type(loss_scale)
            grads = {k: g / g.dtype.type(loss_scale) for k, g in vjp(dlogits * s).items()}
        else:
            grads = vjp(dlogits)
        optimizer.step(grads)
        return loss

    def score():
        logits, _ = apply(params, E, X, training=False, **amp)
        pred = logits.argmax(axis=1)
        return xp.stack([(pred[i] == labels[i]).mean() for i in (val_idx, test_idx)])

    if on_device:
        import cupy

        events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(epochs)]
    host_times = []
    scores = []
    loss = xp.zeros(())
    graphs = graph_score = None  # with cuda_graph: (step, evaluation) graphs, and the score the second writes
    for epoch in range(epochs):
        if on_device:
            events[epoch][0].record()
        else:
            t0 = time.perf_counter()
        if graphs is None:
            loss = step()
        else:
            graphs[0].replay()
        if on_device:
            events[epoch][1].record()
        else:
            host_times.append(time.perf_counter() - t0)
        if evaluate:
            if graphs is None:
                scores.append(score())
            else:
                graphs[1].replay()
                scores.append(graph_score.copy())
        if cuda_graph and graphs is None and epoch + 1 < epochs:
            # The first epoch warmed every cache (launch plans, transposes): capture the next step.
            graphs = (CUDAGraph(), CUDAGraph() if evaluate else None)
            with graphs[0].capture():
                loss = step()
            if evaluate:
                with graphs[1].capture():
                    graph_score = score()
    if on_device:
        events[-1][1].synchronize()
        times = [cupy.cuda.get_elapsed_time(a, b) / 1e3 for a, b in events]
    else:
        times = host_times
    if not scores:
        nan = float("nan")
        return TrainResult(nan, nan, -1, nan, float(loss), times)  # synchronize!
    s = xp.stack(scores)
    s = s.get() if on_device else s  # synchronize!
    best = int(np.argmax(s[:, 0]))  # first epoch of the best validation accuracy
    return TrainResult(
        test_acc=float(s[best, 1]),
        val_acc=float(s[best, 0]),
        best_epoch=best,
        final_test_acc=float(s[-1, 1]),
        final_loss=float(loss),  # synchronize!
        epoch_times=times,
    )
