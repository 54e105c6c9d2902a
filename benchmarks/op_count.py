"""Aten ops and host reads of a layer's repeated training step (issue 26, §2).

Counts, with a :class:`~torch.utils._python_dispatch.TorchDispatchMode`, the
ops one fwd+bwd dispatches after a first one on the same graph (the graph's
structures then come from the cache), for each backend of
``MetricAttentionConv`` beside ``GATConv``; with ``--dense``, for
``dense_metric_attention`` with its augmentation as torch ops and fused
(issue 27, §4; without CUDA the fused kernels run in Triton's interpreter on
CPU tensors). No time is measured::

    python -m benchmarks.op_count --nodes 2708 --edges 10556
    python -m benchmarks.op_count --dense
"""
from __future__ import annotations

import argparse
import os
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Ops that read a value back to the host (a sync on a GPU).
HOST_READS = ('_local_scalar_dense', 'nonzero', 'unique', '_unique2',
              'unique_consecutive', 'item')


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while active, by name, those inside
    this package's custom operators included (their implementations run
    under the mode again), and the Triton kernels launched (``launches``; the
    copies Triton's interpreter makes during a launch are no op of the step)."""
    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.launches: Counter[str] = Counter()
        self._launching = False
        self._depth = 0  # the mode re-enters itself inside the custom ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._launching:
            return func(*args, **(kwargs or {}))
        self.ops[func.overloadpacket.__name__] += 1
        inside = _custom_op_implementation(str(func.overloadpacket))
        if inside is not None:
            with self:
                return inside(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        if self._depth == 0:
            self._tables = _triton_kernel_tables()
            for table in self._tables:
                for name, kernel in table.items():
                    table[name] = _CountedKernel(self, name, kernel)
        self._depth += 1
        return super().__enter__()

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0:
            for table in self._tables:
                for name, kernel in table.items():
                    table[name] = kernel.kernel
        return super().__exit__(*exc)


class _CountedKernel:
    """A Triton kernel whose launches an :class:`OpCounter` counts."""
    def __init__(self, counter: OpCounter, name: str, kernel):
        self.counter, self.name, self.kernel = counter, name, kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.counter.launches[self.name] += 1
            self.counter._launching = True
            try:
                return self.kernel[grid](*args, **kwargs)
            finally:
                self.counter._launching = False
        return launch


def _triton_kernel_tables() -> list[dict]:
    """The tables the launchers read their kernels from (the sparse
    attention's, the dense augmentation's and the exact dense
    correction's)."""
    from pyg_metric_attn.nn.triton import HAVE_TRITON, exact, function
    if not HAVE_TRITON:
        return []
    from pyg_metric_attn.nn.augmentation.kernels import KERNELS
    return [function.kernels(), KERNELS, exact.kernels()]


def autograd_nodes(tensor: torch.Tensor) -> str:
    """The class names of the autograd nodes behind ``tensor``,
    space-separated (e.g. ``TritonAttentionBackward``: the package's kernels
    ran eagerly, :mod:`pyg_metric_attn.nn.eager_operator`)."""
    names, stack, seen = [], [tensor.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return ' '.join(names)


def _custom_op_implementation(name: str):
    from pyg_metric_attn.nn.augmentation import function as augmentation
    from pyg_metric_attn.nn.triton import function
    return (function.IMPLEMENTATIONS | augmentation.IMPLEMENTATIONS).get(name)


def repeated_step_ops(conv: torch.nn.Module, *inputs) -> Counter[str]:
    """The ops of ``conv(*inputs).sum().backward()`` after a first such step."""
    return repeated_step(conv, *inputs).ops


def repeated_step(conv: torch.nn.Module, *inputs) -> OpCounter:
    """The :class:`OpCounter` of ``conv(*inputs).sum().backward()`` after a
    first such step (ops and Triton launches)."""
    conv(*inputs).sum().backward()
    with OpCounter() as counter:
        conv(*inputs).sum().backward()
    return counter


def dense_rows() -> None:
    """The table of ``--dense``: batch 2, 4 heads, 64 points, metric width
    15, value width 16 (the augmented width, as 63 + 1 = 64), a training
    step with and without a padding mask."""
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if device == 'cpu':  # before anything imports triton
        os.environ.setdefault('TRITON_INTERPRET', '1')
    from pyg_metric_attn.nn import augmentation
    from pyg_metric_attn.nn.functional import dense_metric_attention

    torch.manual_seed(0)
    query, key = (torch.randn(2, 4, 64, 15, device=device, requires_grad=True)
                  for _ in range(2))
    value = torch.randn(2, 4, 64, 16, device=device, requires_grad=True)
    lengths = torch.tensor([64, 40], device=device).view(2, 1, 1, 1)
    padding = torch.arange(64, device=device) < lengths
    print('| augmentation | precision | mask | aten ops per fwd+bwd | Triton '
          'launches | host reads |\n|---|---|---|---|---|---|')
    fused_devices = augmentation.FUSED_DEVICES
    for route, devices in (('torch ops', ()), ('fused', (device,))):
        augmentation.FUSED_DEVICES = devices
        for precision in ('fast', 'checked'):
            for mask in (None, padding):
                counter = repeated_step(
                    lambda *points, mask=mask, precision=precision:
                    dense_metric_attention(*points, attn_mask=mask,
                                           precision=precision)[0],
                    query, key, value)
                reads = {op: counter.ops[op] for op in HOST_READS
                         if counter.ops[op]}
                print(f'| {route} | {precision} | {mask is not None} | '
                      f'{sum(counter.ops.values())} | '
                      f'{sum(counter.launches.values())} | {reads or "-"} |')
    augmentation.FUSED_DEVICES = fused_devices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--nodes', type=int, default=2708)
    parser.add_argument('--edges', type=int, default=10556)
    parser.add_argument('--metrics', default='metric,l2,dot')
    parser.add_argument('--backends', default='fused,scatter')
    parser.add_argument('--dense', action='store_true',
                        help='count dense_metric_attention instead (issue 27)')
    args = parser.parse_args()
    if args.dense:
        return dense_rows()
    from torch_geometric.nn import GATConv

    from pyg_metric_attn import MetricAttentionConv

    torch.manual_seed(0)
    x = torch.randn(args.nodes, 64, requires_grad=True)
    edge_index = torch.randint(0, args.nodes, (2, args.edges))
    layers = {'GATConv': GATConv(64, 16, heads=4)}
    for metric in args.metrics.split(','):
        for backend in args.backends.split(','):
            layers[f'{metric}-{backend}'] = MetricAttentionConv(
                64, 16, heads=4, metric=metric, backend=backend)
    print('| layer | aten ops per fwd+bwd | Triton launches | host reads |\n'
          '|---|---|---|---|')
    for name, conv in layers.items():
        counter = repeated_step(conv, x, edge_index)
        ops = counter.ops
        reads = {op: ops[op] for op in HOST_READS if ops[op]}
        print(f'| {name} | {sum(ops.values())} | {sum(counter.launches.values())} '
              f'| {reads or "-"} |')


if __name__ == '__main__':
    main()
