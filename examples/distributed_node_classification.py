"""Node classification on mini-batches, in one process or many (DDP).

Each rank trains on its share of the training nodes (a new split every
epoch), sampled into mini-batches by PyG's ``NeighborLoader`` (needs the
``[sampling]`` extra); ``DistributedDataParallel`` averages the gradients.
Rank 0 evaluates on the full graph, shows the progress, and writes
``metrics.json``/``metrics.csv`` and the checkpoints ``last.pt``/``best.pt``
to ``--out`` (atomically, checksummed). The graph is a stochastic block model
with noisy class features (``pyg_metric_attn.datasets.stochastic_block_graph``),
the same on every rank.

    # one process
    python examples/distributed_node_classification.py --epochs 5
    # two processes on this machine (gloo on CPU, nccl on GPUs)
    torchrun --nproc_per_node=2 examples/distributed_node_classification.py
    # two machines of two processes: the same command on each, --node_rank 0/1
    torchrun --nnodes=2 --nproc_per_node=2 --node_rank=0 \\
        --master_addr=HOST0 --master_port=29500 \\
        examples/distributed_node_classification.py
    # after a crash or a kill of any rank: start the same command again with
    # --resume (goes on from the last finished epoch, same number of processes)

When a rank dies torchrun's agent stops the others on its machine; ranks
elsewhere (or started without torchrun) fail at once with "error: rank R of
N: a collective operation failed ...", and a rank that hangs makes the others
fail so after --timeout seconds.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import warnings

import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader

from pyg_metric_attn import MetricAttentionConv
from pyg_metric_attn.datasets import stochastic_block_graph
from pyg_metric_attn.training import (
    CollectiveError,
    DistributedContext,
    Trainer,
    process_group,
    seed_everything,
    shard_indices,
)
from pyg_metric_attn.utils.io import FolderLockedError, locked_folder


class NodeClassifier(torch.nn.Module):
    """Two metric-attention layers: ``[N, F] -> [N, C]`` logits."""
    def __init__(self, in_channels: int, hidden: int, num_classes: int,
                 heads: int, **conv_kwargs):
        super().__init__()
        self.conv1 = MetricAttentionConv(in_channels, hidden, heads=heads,
                                         **conv_kwargs)
        self.conv2 = MetricAttentionConv(hidden * heads, num_classes,
                                         **conv_kwargs)

    def forward(self, x, edge_index):
        return self.conv2(F.elu(self.conv1(x, edge_index)), edge_index)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    graph = parser.add_argument_group('graph')
    graph.add_argument('--nodes', type=int, default=20_000)
    graph.add_argument('--classes', type=int, default=4)
    graph.add_argument('--degree', type=float, default=10.0,
                       help='average degree')
    graph.add_argument('--homophily', type=float, default=0.6)
    graph.add_argument('--features', type=int, default=8)
    graph.add_argument('--signal', type=float, default=0.7,
                       help='length of the class mean in the features')
    graph.add_argument('--data-seed', type=int, default=0)
    model = parser.add_argument_group('model and training')
    model.add_argument('--hidden', type=int, default=8)
    model.add_argument('--heads', type=int, default=2)
    model.add_argument('--time-scale', type=float, default=4.0)
    model.add_argument('--backend', default='auto',
                       help='MetricAttentionConv backend')
    model.add_argument('--num-neighbors', type=int, nargs='+', default=[10, 10],
                       help='neighbours sampled per hop (-1: all)')
    model.add_argument('--batch-size', type=int, default=128,
                       help='seed nodes per batch and process')
    model.add_argument('--epochs', type=int, default=10)
    model.add_argument('--lr', type=float, default=0.01)
    model.add_argument('--weight-decay', type=float, default=5e-3)
    model.add_argument('--seed', type=int, default=0)
    run = parser.add_argument_group('run')
    run.add_argument('--out', default='runs/distributed_node_classification')
    run.add_argument('--resume', action='store_true',
                     help="go on from --out's last checkpoint")
    run.add_argument('--timeout', type=float, default=None,
                     help='seconds a rank waits for the others before it '
                     'fails (default: $PYG_METRIC_ATTN_DIST_TIMEOUT or 600)')
    run.add_argument('--threads', type=int, default=None,
                     help='torch threads per process (torchrun sets 1)')
    run.add_argument('--no-progress', action='store_true')
    args = parser.parse_args(argv)
    if len(args.num_neighbors) != 2:
        parser.error('--num-neighbors: one count per layer (2)')
    return args


def make_data(args: argparse.Namespace) -> Data:
    return stochastic_block_graph(args.nodes, args.classes, args.degree,
                                  args.homophily, args.features, args.signal,
                                  seed=args.data_seed)


def build_model(args: argparse.Namespace, data: Data) -> NodeClassifier:
    """The model, initialised from ``--seed`` (the same on every rank)."""
    seed_everything(args.seed)
    return NodeClassifier(data.num_features, args.hidden, args.classes,
                          args.heads, time_scale=args.time_scale,
                          backend=args.backend)


def make_optimizer(args: argparse.Namespace,
                   model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=args.lr,
                            weight_decay=args.weight_decay)


def train(args: argparse.Namespace, ctx: DistributedContext) -> Trainer:
    data = make_data(args)
    model = build_model(args, data).to(ctx.device)
    seed_everything(ctx.rank_seed(args.seed))  # each rank samples its own way
    optimizer = make_optimizer(args, model)
    train_nodes = data.train_mask.nonzero().view(-1)

    def batches(epoch: int) -> NeighborLoader:
        share = shard_indices(len(train_nodes), ctx, args.seed, epoch)
        return NeighborLoader(data, num_neighbors=args.num_neighbors,
                              input_nodes=train_nodes[share],
                              batch_size=args.batch_size)

    def step(model: torch.nn.Module, batch: Data) -> torch.Tensor:
        batch = batch.to(ctx.device)
        out = model(batch.x, batch.edge_index)[:batch.batch_size]
        return F.cross_entropy(out, batch.y[:batch.batch_size])

    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        if not ctx.is_main:  # the Trainer keeps rank 0's metrics
            return {}
        predicted = model(data.x.to(ctx.device),
                          data.edge_index.to(ctx.device)).argmax(-1).cpu()
        correct = predicted == data.y
        return {f'{split}_acc': float(correct[data[f'{split}_mask']].float().mean())
                for split in ('val', 'test')}

    trainer = Trainer(model, optimizer, step, evaluate, monitor='val_acc',
                      out_dir=args.out, progress=not args.no_progress,
                      desc=f'rank 0 of {ctx.world_size}', distributed=ctx)
    lock = locked_folder(args.out) if ctx.is_main else contextlib.nullcontext()
    with lock:
        trainer.fit(batches, args.epochs, resume=args.resume)
    if ctx.is_main:
        print(f'{data.num_nodes} nodes, {data.num_edges} edges, '
              f'{len(train_nodes)} training nodes; {ctx.world_size} process(es)')
        for row in trainer.history:
            print(f"epoch {row['epoch']:3d}  loss {row['train_loss']:.4f}  "
                  f"val {row['val_acc']:.4f}  test {row['test_acc']:.4f}  "
                  f"{len(train_nodes) / row['epoch_seconds']:8.0f} seeds/s")
        print(f'checkpoints and metrics in {args.out}/')
    return trainer


def main(argv=None) -> int:
    args = parse_args(argv)
    # torch-sparse's sampler (the [sampling] extra) is the one for this torch:
    # pyg-lib, which PyG prefers, has no wheel for it.
    warnings.filterwarnings('ignore', message=".*without a 'pyg-lib'")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        with process_group(args.timeout) as ctx:
            train(args, ctx)
    except (CollectiveError, FolderLockedError) as error:
        print(f'error: {error}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
