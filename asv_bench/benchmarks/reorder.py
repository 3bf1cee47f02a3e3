"""The N:M reorder (PPoPP'25): time and violations removed; the locality reorder: time and U/nnz."""

from .common import REORDER_GRAPHS, gpu_cache, require_gpu

PATTERNS = ["2:4", "4:2:8"]


class Reorder:
    params = [REORDER_GRAPHS, PATTERNS]
    param_names = ["graph", "pattern"]
    timeout = 600
    number = 1
    repeat = (1, 3, 30.0)

    def setup_cache(self):
        return gpu_cache(REORDER_GRAPHS)

    def setup(self, graphs, graph, pattern):
        require_gpu()
        import tcgnn_py as tg

        self.A = graphs[graph]
        self.report = tg.reorder(self.A, pattern, device="cuda").report  # also compiles the kernels

    def time_reorder(self, graphs, graph, pattern):
        import tcgnn_py as tg

        tg.reorder(self.A, pattern, device="cuda")  # returns host results: synchronized

    def track_violations_removed(self, graphs, graph, pattern):
        return 100 * self.report.improvement_rate

    track_violations_removed.unit = "% of PScore removed"

    def track_final_pscore(self, graphs, graph, pattern):
        return self.report.pscore

    track_final_pscore.unit = "violating segment vectors"


class LocalityReorder:
    """The locality reorder: time on the device and how much it lowers U/nnz (16-row windows)."""

    params = [REORDER_GRAPHS + ["powerlaw:1000000:16000000"]]
    param_names = ["graph"]
    timeout = 600
    number = 1
    repeat = (1, 3, 30.0)

    def setup_cache(self):
        return gpu_cache(REORDER_GRAPHS + ["powerlaw:1000000:16000000"])

    def setup(self, graphs, graph):
        require_gpu()
        import tcgnn_py as tg

        self.A = graphs[graph]
        self.report = tg.reorder(self.A, "locality", device="cuda").report  # also compiles the kernel

    def time_reorder(self, graphs, graph):
        import tcgnn_py as tg

        tg.reorder(self.A, "locality", device="cuda")  # returns host results: synchronized

    def track_pairs_per_nnz(self, graphs, graph):
        return self.report["tcgnn"].pairs_per_nnz

    track_pairs_per_nnz.unit = "U/nnz after (16-row windows)"

    def track_pairs_ratio(self, graphs, graph):
        return self.report["tcgnn"].pairs / self.report.initial["tcgnn"].pairs

    track_pairs_ratio.unit = "U after / U before"
