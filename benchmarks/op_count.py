"""Aten ops and host reads of a layer's repeated training step (issue 26, §2).

Counts, with a :class:`~torch.utils._python_dispatch.TorchDispatchMode`, the
ops one fwd+bwd dispatches after a first one on the same graph (the graph's
structures then come from the cache), for each backend of
``MetricAttentionConv`` beside ``GATConv``. No time is measured::

    python -m benchmarks.op_count --nodes 2708 --edges 10556
"""
from __future__ import annotations

import argparse
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Ops that read a value back to the host (a sync on a GPU).
HOST_READS = ('_local_scalar_dense', 'nonzero', 'unique', '_unique2',
              'unique_consecutive', 'item')


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while active, by name."""
    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def repeated_step_ops(conv: torch.nn.Module, *inputs) -> Counter[str]:
    """The ops of ``conv(*inputs).sum().backward()`` after a first such step."""
    conv(*inputs).sum().backward()
    with OpCounter() as counter:
        conv(*inputs).sum().backward()
    return counter.ops


def main() -> None:
    from torch_geometric.nn import GATConv

    from pyg_metric_attn import MetricAttentionConv

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--nodes', type=int, default=2708)
    parser.add_argument('--edges', type=int, default=10556)
    parser.add_argument('--metrics', default='metric,l2,dot')
    parser.add_argument('--backends', default='fused,scatter')
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.nodes, 64, requires_grad=True)
    edge_index = torch.randint(0, args.nodes, (2, args.edges))
    layers = {'GATConv': GATConv(64, 16, heads=4)}
    for metric in args.metrics.split(','):
        for backend in args.backends.split(','):
            layers[f'{metric}-{backend}'] = MetricAttentionConv(
                64, 16, heads=4, metric=metric, backend=backend)
    print('| layer | aten ops per fwd+bwd | host reads |\n|---|---|---|')
    for name, conv in layers.items():
        ops = repeated_step_ops(conv, x, edge_index)
        reads = {op: ops[op] for op in HOST_READS if ops[op]}
        print(f'| {name} | {sum(ops.values())} | {reads or "-"} |')


if __name__ == '__main__':
    main()
