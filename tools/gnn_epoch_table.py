"""Time per training epoch: tcgnn_py.nn beside the same models on cupyx and in PyTorch Geometric.

    python tools/gnn_epoch_table.py cora citeseer pubmed blogcatalog3 powerlaw:1000000:16000000 \
        [--torch-path /opt/torch] [--epochs 20] [--json FILE] [--markdown FILE]

PyTorch and PyG are imported here only, never by tcgnn_py.  Their models are
the ones in PyG's examples (gcn.py: GCNConv x 2, cached normalisation;
agnn.py: Linear, AGNNConv x 2, Linear), with the same widths, dropout and
optimizer settings as ``tcgnn_py.nn``'s.  ``pyg_csr`` feeds GCNConv a
``torch.sparse_csr`` adjacency (cuSPARSE SpMM) instead of an edge list.
Without torch_geometric only the tcgnn_py and cupyx columns are filled.
"""

import argparse
import json
import pathlib
import sys

import numpy as np


def pyg_builders():
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import AGNNConv, GCNConv
    from torch_geometric.utils import add_self_loops, remove_self_loops

    from tcgnn_py.bench import HIDDEN

    dev = torch.device("cuda")

    def tensors(problem):
        A = problem["adj"].tocoo()
        # A[i, j] != 0: node i gathers from j, i.e. PyG's edge j -> i (source row 0, target row 1).
        ei = torch.tensor(np.vstack([A.col, A.row]), dtype=torch.long, device=dev)
        x = torch.from_numpy(problem["X"]).to(dev)
        y = torch.from_numpy(problem["labels"]).to(dev)
        idx = torch.from_numpy(problem["train_idx"].astype(np.int64)).to(dev)
        return ei, x, y, idx

    def make_step(net, opt, x, adj, y, idx):
        net.train()

        def step():
            opt.zero_grad()
            out = net(x, adj)
            F.cross_entropy(out[idx], y[idx]).backward()
            opt.step()

        return step, torch.cuda.synchronize

    class GCN(torch.nn.Module):
        def __init__(self, f, c):
            super().__init__()
            self.conv1 = GCNConv(f, HIDDEN, cached=True)
            self.conv2 = GCNConv(HIDDEN, c, cached=True)

        def forward(self, x, adj):
            x = F.dropout(x, 0.5, self.training)
            x = F.relu(self.conv1(x, adj))
            x = F.dropout(x, 0.5, self.training)
            return self.conv2(x, adj)

    class AGNN(torch.nn.Module):
        def __init__(self, f, c):
            super().__init__()
            self.lin1 = torch.nn.Linear(f, HIDDEN)
            self.prop1 = AGNNConv(requires_grad=False, add_self_loops=False)
            self.prop2 = AGNNConv(requires_grad=True, add_self_loops=False)
            self.lin2 = torch.nn.Linear(HIDDEN, c)

        def forward(self, x, adj):
            x = F.dropout(x, 0.5, self.training)
            x = F.relu(self.lin1(x))
            x = self.prop2(self.prop1(x, adj), adj)
            x = F.dropout(x, 0.5, self.training)
            return self.lin2(x)

    def build_edge_index(problem, model):
        torch.manual_seed(0)
        ei, x, y, idx = tensors(problem)
        f, c = x.shape[1], problem["n_classes"]
        if model == "gcn":
            net = GCN(f, c).to(dev)
            opt = torch.optim.Adam([dict(params=net.conv1.parameters(), weight_decay=5e-4),
                                    dict(params=net.conv2.parameters(), weight_decay=0)], lr=0.01)
            return make_step(net, opt, x, ei, y, idx)
        ei = add_self_loops(remove_self_loops(ei)[0], num_nodes=x.shape[0])[0]  # as tcgnn_py's A + I
        net = AGNN(f, c).to(dev)
        opt = torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=5e-4)
        return make_step(net, opt, x, ei, y, idx)

    def build_csr(problem, model):
        if model != "gcn":
            return None
        torch.manual_seed(0)
        ei, x, y, idx = tensors(problem)
        n = x.shape[0]
        adj = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1], device=dev), (n, n)).coalesce()
        adj = adj.to_sparse_csr()  # row i gathers from its columns: PyG's adj_t layout
        net = GCN(x.shape[1], problem["n_classes"]).to(dev)
        opt = torch.optim.Adam([dict(params=net.conv1.parameters(), weight_decay=5e-4),
                                dict(params=net.conv2.parameters(), weight_decay=0)], lr=0.01)
        return make_step(net, opt, x, adj, y, idx)

    import torch_geometric

    versions = {"torch": torch.__version__, "torch_geometric": torch_geometric.__version__}
    return {"pyg": build_edge_index, "pyg_csr": build_csr}, versions


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="+")
    ap.add_argument("--torch-path", help="a directory to put on sys.path for torch / torch_geometric")
    ap.add_argument("--epochs", type=int, default=20, help="epochs per timed batch (median of 3)")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    if args.torch_path:
        sys.path.append(args.torch_path)

    from tcgnn_py.bench import bench_gnn, gnn_markdown

    try:
        builders, versions = pyg_builders()
    except ImportError as exc:
        print(f"PyTorch Geometric not available ({exc}): tcgnn_py and cupyx only")
        builders, versions = {}, {}

    rows = []
    for spec in args.graphs:
        got = bench_gnn(spec, epochs=args.epochs, extra=builders)
        rows += got
        print(gnn_markdown(got), flush=True)
    table = gnn_markdown(rows)
    print(table)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"versions": versions, "rows": rows}, indent=1))
    if args.markdown:
        pathlib.Path(args.markdown).write_text(table)


if __name__ == "__main__":
    main()
