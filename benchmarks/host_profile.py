"""Where one training step's time goes: the host or the GPU.

    python -m benchmarks.host_profile [--variant metric-triton]
        [--nodes 2708] [--edges 10556] [--out-channels 16] [--steps 20]
        [--device cuda] [--top 25]
    python -m benchmarks.host_profile --variant mha-metric --length 1024

One case of the GPU suite (:func:`benchmarks.gpu_cases.build_step`): a sparse
layer (``--variant`` one of ``gpu_cases.SPARSE_VARIANTS``; 64 -> 4 heads x
``--out-channels`` on a uniform graph) or a dense module (``mha-*``; bf16,
batch 8, 8 heads of 64, ``--length``), forward + backward. After warm-up
steps it prints

1. the median step time (CUDA events on a GPU), the GPU's kernel time per
   step and the kernels launched per step (:mod:`torch.profiler`): a step
   much longer than its kernels is bound by the host;
2. the host functions with the most own time (:mod:`cProfile`, ``--top``
   rows; the profiler inflates Python's share, so compare rows, not sums);
3. the profiler's table of ops and kernels by self CPU time.

The suite times the cases; this says, for one of them, why it takes what it
takes (written for the small graphs where the layer is host-bound).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys

import torch


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog='python -m benchmarks.host_profile',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('--variant', default='metric-triton')
    parser.add_argument('--nodes', type=int, default=2_708)
    parser.add_argument('--edges', type=int, default=10_556)
    parser.add_argument('--out-channels', type=int, default=16)
    parser.add_argument('--length', type=int, default=1024,
                        help='sequence length of the mha-* variants')
    parser.add_argument('--steps', type=int, default=20)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available()
                        else 'cpu')
    parser.add_argument('--top', type=int, default=25)
    return parser.parse_args(argv)


def case_of(args: argparse.Namespace) -> dict:
    if args.variant.startswith('mha-'):
        return dict(kind='dense-module', variant=args.variant, batch=8,
                    heads=8, head_dim=64, length=args.length, dtype='bfloat16')
    return dict(kind='sparse', variant=args.variant, graph='uniform',
                nodes=args.nodes, edges=args.edges, dtype='float32', heads=4,
                channels=64, out_channels=args.out_channels)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.device == 'cpu':  # before anything imports triton
        os.environ.setdefault('TRITON_INTERPRET', '1')
    from benchmarks import gpu_cases

    device = torch.device(args.device)
    case = case_of(args)
    step = gpu_cases.build_step(case, 'forward_backward', gpu_cases.Job(device))
    for _ in range(gpu_cases.warmup_steps(case) + 2):
        step()
    gpu_cases.synchronize(device)
    times = [gpu_cases.timed(step, device) for _ in range(args.steps)]

    events, kernel_s, launches = gpu_cases.profile_steps(step, device,
                                                         args.steps)
    kernel_ms = kernel_s * 1e3

    host = cProfile.Profile()
    host.enable()
    for _ in range(args.steps):
        step()
    gpu_cases.synchronize(device)
    host.disable()

    median_ms = statistics.median(times) * 1e3
    print(f'case: {case}')
    print(f'device: {device}; {args.steps} fwd+bwd steps after warm-up')
    print(f'median step: {median_ms:.3f} ms; GPU kernels: {kernel_ms:.3f} ms '
          f'per step ({kernel_ms / median_ms:.0%} of the step), '
          f'{launches:.0f} launches per step')
    print(f'\n## host functions by own time (cProfile, {args.steps} steps)')
    report = io.StringIO()
    pstats.Stats(host, stream=report).sort_stats('tottime').print_stats(args.top)
    print(report.getvalue().split('\n\n', 1)[-1].rstrip())
    print(f'\n## ops and kernels by self CPU time (torch.profiler, {args.steps} '
          'steps)')
    print(events.table(sort_by='self_cpu_time_total', row_limit=args.top,
                       max_name_column_width=60))


if __name__ == '__main__':
    main()
