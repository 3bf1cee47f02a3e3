"""The N:M reorder (PPoPP'25): time on the device and violations it removes."""

from .common import REORDER_GRAPHS, load, require_gpu

PATTERNS = ["2:4", "4:2:8"]


class Reorder:
    params = [REORDER_GRAPHS, PATTERNS]
    param_names = ["graph", "pattern"]
    timeout = 600
    number = 1
    repeat = (1, 3, 30.0)

    def setup_cache(self):
        return load(REORDER_GRAPHS)

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
