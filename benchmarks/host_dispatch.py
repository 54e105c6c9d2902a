"""What calling the Triton kernels through their custom operators costs the host.

    python -m benchmarks.host_dispatch [--nodes 100] [--edges 400]
        [--steps 200] [--rounds 3] [--device cpu]

One training step (forward and backward) of
``MetricAttentionConv(64, 16, heads=4, backend='triton')`` on a uniform
graph, with every Triton launch replaced by a stub that returns at once, so
what is timed is the host's path around the kernels: the layer's own ops
(which do run), the launch parameters, and how the kernels' code is
entered. Two ways of entering it, alternated ``--rounds`` times in one
process (median step of each round, milliseconds):

* ``operator``: through ``pyg_metric_attn::triton_attention`` and its
  backward operator, as :func:`torch.compile` sees them (the only way
  before 2026-11-27);
* ``eager``: :class:`pyg_metric_attn.nn.triton.function.TritonAttention`,
  the same code without the dispatcher (the default outside compilation).

The difference is host time that a GPU step pays too; on a GPU it matters
where a step is bound by the host (small graphs, BENCHMARKS.md). On a CPU the
layer needs ``TRITON_INTERPRET=1``, set here before triton is imported; no
kernel runs, so the interpreter costs nothing. The stubbed kernels leave
their outputs as allocated, so on a CPU the layer's own ops then compute on
whatever those hold, denormal floats included, which x86 computes with
slowly: denormals are flushed to zero while the steps run (on a CPU the
layer's dense ops are real work, on a GPU they are launches).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog='python -m benchmarks.host_dispatch',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('--nodes', type=int, default=100)
    parser.add_argument('--edges', type=int, default=400)
    parser.add_argument('--steps', type=int, default=200,
                        help='timed steps per round (default: 200)')
    parser.add_argument('--rounds', type=int, default=3,
                        help='rounds of each way, alternated (default: 3)')
    parser.add_argument('--device', default='cpu')
    return parser.parse_args(argv)


class _StubKernel:
    """A Triton kernel whose launches do nothing."""
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    """Median step time (ms) of each round, by way of entering the kernels."""
    if args.device == 'cpu':
        os.environ.setdefault('TRITON_INTERPRET', '1')
    import torch

    from benchmarks.graphs import make_graph
    from pyg_metric_attn import MetricAttentionConv
    from pyg_metric_attn.nn import triton as triton_attention
    from pyg_metric_attn.nn.triton import function

    device = torch.device(args.device)
    torch.manual_seed(0)
    x = torch.randn(args.nodes, 64, device=device)
    edge_index = make_graph('uniform', args.nodes, args.edges, device)
    conv = MetricAttentionConv(64, 16, heads=4, backend='triton').to(device)
    tables = function.kernels()
    real = dict(tables)
    tables.update({name: _StubKernel() for name in tables})
    ways = {'operator': function.attention, 'eager': function.run_attention}

    def step() -> None:
        for parameter in conv.parameters():
            parameter.grad = None
        conv(x, edge_index).sum().backward()

    results: dict[str, list[float]] = {way: [] for way in ways}
    flushed = torch.set_flush_denormal(device.type == 'cpu')
    try:
        for _ in range(args.rounds):
            for way, call in ways.items():
                triton_attention.run_attention = call
                for _ in range(20):
                    step()
                times = []
                for _ in range(args.steps):
                    if device.type == 'cuda':
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    step()
                    times.append(time.perf_counter() - start)
                results[way].append(statistics.median(times) * 1e3)
    finally:
        triton_attention.run_attention = function.run_attention
        tables.update(real)
        if flushed:
            torch.set_flush_denormal(False)
    return results


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results = measure(args)
    print(f'{args.nodes} nodes / {args.edges} edges, {args.device}, kernels '
          f'stubbed; median ms per fwd+bwd step, {args.rounds} rounds')
    print('| way | ' + ' | '.join(f'round {i + 1}' for i in range(args.rounds))
          + ' | median |')
    print('|---|' + '---|' * (args.rounds + 1))
    for way, times in results.items():
        print(f'| {way} | ' + ' | '.join(f'{t:.3f}' for t in times)
              + f' | {statistics.median(times):.3f} |')
    ratio = statistics.median(results['eager']) / statistics.median(
        results['operator'])
    print(f'eager / operator: {ratio:.2f}')


if __name__ == '__main__':
    main()
