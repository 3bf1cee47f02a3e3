"""Layer 4: GNN layers on :class:`~tcgnn_py.TiledMatrix`, with explicit backward passes (no PyTorch).

Functional layers return ``(out, vjp)``, where ``vjp`` maps the gradient of the
output to the gradients of the inputs.  Arrays are NumPy on the CPU (the
reference path) and CuPy on the GPU; everything runs on the graph's device.

- Graph preprocessing: :func:`gcn_norm`, :func:`add_self_loops`; :class:`RowEdges` (a matrix the layers multiply
  by the library's CSR kernel, for one used a few times); batches of small graphs: :func:`batch` (one
  block-diagonal graph) and :func:`readout` (per-graph sum, mean or max); neighbor-sampled mini-batches:
  :func:`sample_blocks` (a batch's bipartite :class:`Block` per hop) and :class:`NeighborLoader`.
- Layers: :func:`gcn_conv`, :func:`sage_conv` (on a :class:`Block`), :func:`agnn_conv`, :func:`gat_conv`,
  :func:`graph_attention` (fused), :func:`linear`, :func:`relu`, :func:`elu`, :func:`dropout`,
  :func:`bias_act_dropout` (a layer's elementwise tail in one pass); loss :func:`cross_entropy`; metric
  :func:`accuracy`.
- Models: :func:`gcn_init` / :func:`gcn_apply`, :func:`sage_init` / :func:`sage_apply`, :func:`agnn_init` /
  :func:`agnn_apply`, :func:`gat_init` / :func:`gat_apply`.
- Training: :class:`Adam`, :func:`glorot`, :func:`default_rng`, :func:`train` (full-batch, with model
  selection on the validation split).
"""

from ._attention import agnn_conv, gat_conv, graph_attention
from ._batch import GraphBatch, batch, readout
from ._edges import RowEdges
from ._edges import CSREdges, EdgeView  # for the library's other packages (the distributed layers, the harness)
from ._layers import accuracy, bias_act_dropout, cross_entropy, dropout, elu, gcn_conv, linear, relu
from ._models import agnn_apply, agnn_init, default_rng, gat_apply, gat_init, gcn_apply, gcn_init, glorot
from ._norm import add_self_loops, gcn_norm
from ._optim import Adam
from ._sample import Block, NeighborLoader, sage_apply, sage_conv, sage_init, sample_blocks
from ._train import TrainResult, train

__all__ = [
    "gcn_norm",
    "add_self_loops",
    "RowEdges",
    "gcn_conv",
    "agnn_conv",
    "gat_conv",
    "graph_attention",
    "linear",
    "relu",
    "elu",
    "dropout",
    "bias_act_dropout",
    "cross_entropy",
    "accuracy",
    "glorot",
    "default_rng",
    "gcn_init",
    "gcn_apply",
    "agnn_init",
    "agnn_apply",
    "gat_init",
    "gat_apply",
    "Adam",
    "train",
    "TrainResult",
    "batch",
    "GraphBatch",
    "readout",
    "sample_blocks",
    "Block",
    "NeighborLoader",
    "sage_init",
    "sage_conv",
    "sage_apply",
]
