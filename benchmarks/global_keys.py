"""What sampling the former's global keys in every forward pass costs a
human_seg training step, against reading them from the meshes'
farthest-point ranks (``MeshPreprocessing(farthest_point_ranks=True)``, what
the human_seg task prepares since 2026-11-27).

    python -m benchmarks.global_keys [--root ../shared/datasets/human_seg]
        [--processed-dir DIR] [--meshes 32] [--repeats 3] [--threads 1]
        [--copies 1] [--workers 2] [--device cpu] [--out FOLDER]

The training steps (forward, backward, Adam) of the chosen recipe's former
(perturbed copies of every training mesh, one mesh per step; ``--copies
0``: the meshes alone, which a GPU machine prepares in seconds) on the first
``--meshes`` meshes an epoch draws, from the same initial model and
optimiser, with the keys sampled from ``pos`` (``sampled``: the meshes
without their ranks) and read from the ranks (``ranks``), alternated
``--repeats`` times in one process. Both ways take the same vertices, so
their losses must agree to the bit (checked). Also counted: the aten ops
each way dispatches per step (a GPU launches a kernel for nearly every
one). Without ``--root`` the procedural
humanoids are used. Writes ``global_keys.md`` and ``global_keys.json`` to
``--out``.
"""
from __future__ import annotations

import argparse
import copy
import itertools
import json
import statistics
import time
from pathlib import Path

import torch
from torch_geometric.loader import DataLoader
from tqdm.auto import tqdm

from benchmarks.op_count import OpCounter
from pyg_metric_attn.experiments.tasks.human_seg import HumanSegTask
from pyg_metric_attn.utils.denormals import denormals_flushed

#: The chosen recipe (RESULTS.md, "MetricMeshFormer trained for 200 epochs").
RECIPE = dict(val_fraction=0.1, augment_copies=1, batch_size=1,
              augment_perturbations='subdivision,decimation,anisotropic_scaling,'
                                    'jitter')
WAYS = ('sampled', 'ranks')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog='python -m benchmarks.global_keys',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('--root', help='MeshCNN human_seg folder (default: '
                        'procedural humanoids)')
    parser.add_argument('--processed-dir', help='where the processed meshes '
                        'are (or go)')
    parser.add_argument('--meshes', type=int, default=32)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--copies', type=int, default=1, choices=(0, 1),
                        help="perturbed copies per kind (the recipe's 1)")
    parser.add_argument('--workers', type=int, default=2,
                        help='processes preparing the meshes')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--out', type=Path)
    parser.add_argument('--no-progress', dest='progress', action='store_false')
    return parser.parse_args(argv)


def without_ranks(batch):
    """A copy of ``batch`` whose former samples its keys from ``pos``."""
    batch = copy.copy(batch)
    del batch.farthest_point_rank
    return batch


def measure(args: argparse.Namespace, **options) -> dict:
    """Milliseconds per step each way (the medians of the repeats), their
    ratio, and the aten ops dispatched per step each way; ``options``: task
    options that replace the recipe's."""
    torch.set_num_threads(args.threads)
    options = {**RECIPE, 'root': args.root, 'processed_dir': args.processed_dir,
               'augment_copies': args.copies, 'num_workers': args.workers,
               **options}
    task = HumanSegTask(progress=args.progress, device=args.device, **options)
    train = task.augmented(task.datasets()[0])
    torch.manual_seed(0)  # the copies an epoch draws
    ranked = [task.placement.move(batch) for batch in itertools.islice(
        DataLoader(train, 1, shuffle=True), args.meshes)]
    batches = {'ranks': ranked, 'sampled': [without_ranks(b) for b in ranked]}
    torch.manual_seed(0)
    model = task.placement.move(task.build_model('metricformer'))
    optimizer = task.build_optimizer(model)
    start = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())

    def steps(way: str) -> list[float]:
        model.load_state_dict(start[0])
        optimizer.load_state_dict(start[1])
        torch.manual_seed(1)  # the same dropout masks each way
        losses = []
        for batch in batches[way]:
            optimizer.zero_grad()
            loss = task.training_loss(model, batch)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        return torch.stack(losses).tolist()

    def synchronize() -> None:
        if task.placement.device.type == 'cuda':
            torch.cuda.synchronize()

    times: dict[str, list[float]] = {way: [] for way in WAYS}
    losses = {}
    with denormals_flushed():
        for way in WAYS:  # warm-up
            losses[way] = steps(way)
        rounds = tqdm(range(args.repeats), desc='repeats', disable=not args.progress)
        for repeat in rounds:
            for way in (WAYS if repeat % 2 == 0 else WAYS[::-1]):
                synchronize()
                begin = time.perf_counter()
                steps(way)
                synchronize()
                times[way].append(1e3 * (time.perf_counter() - begin) / args.meshes)
        counts = {}
        for way in WAYS:
            with OpCounter() as counter:
                steps(way)
            counts[way] = counter.ops
    if losses['sampled'] != losses['ranks']:
        raise AssertionError('the two ways took different steps: '
                             f'{losses["sampled"]} vs {losses["ranks"]}')
    median = {way: statistics.median(times[way]) for way in WAYS}
    return {
        'device': str(task.placement.device), 'threads': args.threads,
        'meshes': args.meshes,
        'vertices': [int(batch.num_nodes) for batch in ranked],
        'ms_per_step': times, 'median_ms_per_step': median,
        'ratio': median['ranks'] / median['sampled'],
        'ops_per_step': {way: sum(counts[way].values()) / args.meshes
                         for way in WAYS},
    }


def report(result: dict) -> str:
    lines = ['| keys | ms per step (median) | per repeat | aten ops per step |',
             '|---|---|---|---|']
    for way in WAYS:
        lines.append(f"| {way} | {result['median_ms_per_step'][way]:.1f} | "
                     + ', '.join(f'{t:.1f}' for t in result['ms_per_step'][way])
                     + f" | {result['ops_per_step'][way]:.0f} |")
    vertices = result['vertices']
    lines += ['', f"ranks / sampled: {result['ratio']:.3f} ({result['device']}, "
              f"{result['threads']} thread(s), {result['meshes']} meshes of "
              f"{min(vertices)}-{max(vertices)} vertices, mean "
              f"{statistics.mean(vertices):.0f}; the same losses to the bit)"]
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = measure(args)
    text = report(result)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / 'global_keys.md').write_text(text + '\n')
        (args.out / 'global_keys.json').write_text(json.dumps(result, indent=2))


if __name__ == '__main__':
    main()
