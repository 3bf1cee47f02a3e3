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
        from tcgnn_py.bench import gnn_problem

        return {g: gnn_problem(g) for g in self.params[0]}  # graph, features, labels, split

    def setup(self, problems, graph, model, impl):
        require_gpu()
        from tcgnn_py.bench import train_step

        self.step = train_step(problems[graph], model, "tiled" if impl == "tcgnn_py" else "csr", "cuda")
        for _ in range(3):
            self.step()
        _sync()

    def time_epoch(self, problems, graph, model, impl):
        self.step()
        _sync()
