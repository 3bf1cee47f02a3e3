"""Time per training epoch of GCN and AGNN (tcgnn_py.nn): tiled tensor cores against cupyx sparse ops."""

from .common import require_gpu


def _sync():
    import cupy

    cupy.cuda.Device().synchronize()


class TrainEpoch:
    """One full-batch step: forward with dropout, loss, backward, Adam (``python -m tcgnn_py.bench --ops gcn,agnn``)."""

    params = (["cora", "pubmed"], ["gcn", "agnn"], ["tcgnn_py", "cupyx"])
    param_names = ("graph", "model", "impl")
    timeout = 300

    def setup_cache(self):
        return None  # features and labels are loaded in setup (gnn_problem); nothing to share

    def setup(self, _, graph, model, impl):
        require_gpu()
        from tcgnn_py.bench._gnn import gnn_problem, train_step

        self.step = train_step(gnn_problem(graph), model, "tiled" if impl == "tcgnn_py" else "csr", True)
        for _ in range(3):
            self.step()
        _sync()

    def time_epoch(self, _, graph, model, impl):
        self.step()
        _sync()
