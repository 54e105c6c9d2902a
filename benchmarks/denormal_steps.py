"""What denormal floats cost a trained human_seg model on the CPU: training
steps (forward, backward, Adam) and evaluation forward passes of a run's
last checkpoint, with denormals flushed to zero on the CPU threads (as the
Trainer and the command line run them) and without, alternating in one
process, and how many of the model's weights and Adam's moments are
denormal (nonzero and below 1.2e-38 in float32).

    python -m benchmarks.denormal_steps RUN [--meshes 16] [--repeats 3] \
        [--threads 1] [--out FOLDER]

``RUN``: a folder written by ``pyg-metric-attn train human_seg``. Every
repetition starts the training steps from the checkpoint's model and
optimiser, so both settings take the same steps on the same meshes. Writes
``denormal_steps.md`` and ``denormal_steps.json`` to ``--out``.
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

from pyg_metric_attn.experiments.run_folder import load_run
from pyg_metric_attn.training import eval_mode
from pyg_metric_attn.utils.denormals import denormals_flushed
from pyg_metric_attn.utils.io import load_verified

SMALLEST_NORMAL = torch.finfo(torch.float32).tiny


def denormal_count(tensors) -> tuple[int, int]:
    """``(denormal entries, entries)`` of the floating-point tensors."""
    tensors = [t for t in tensors if torch.is_tensor(t) and t.is_floating_point()]
    denormal = sum(int(((t != 0) & (t.abs() < SMALLEST_NORMAL)).sum())
                   for t in tensors)
    return denormal, sum(t.numel() for t in tensors)


def measure(run: str, meshes: int = 16, repeats: int = 3,
            progress: bool = True) -> dict:
    """Milliseconds per training step and per evaluation forward pass over
    ``meshes`` training meshes, each setting ``repeats`` times (medians), and
    the denormal counts of the run's last checkpoint."""
    task, model, description = load_run(run, 'human_seg', {})
    state = load_verified(Path(run) / 'last.pt')
    model.load_state_dict(state['model'])
    optimizer = task.build_optimizer(model)
    optimizer.load_state_dict(state['optimizer'])  # lr, moments
    train = task.meshes('train')
    batches = list(itertools.islice(DataLoader(train, 1), meshes))
    start_model, start_optimizer = (copy.deepcopy(model.state_dict()),
                                    copy.deepcopy(optimizer.state_dict()))

    def training_steps() -> None:
        model.load_state_dict(start_model)
        optimizer.load_state_dict(start_optimizer)
        model.train()
        for batch in batches:
            optimizer.zero_grad(set_to_none=True)
            task.training_loss(model, batch).backward()
            optimizer.step()

    def forward_passes() -> None:
        with eval_mode(model), torch.no_grad():
            for batch in batches:
                task.forward(model, batch)

    times: dict[str, dict[str, list[float]]] = {
        kind: {'flushed': [], 'not flushed': []} for kind in ('train', 'eval')}
    jobs = [(kind, setting) for _ in range(repeats) for kind in times
            for setting in ('not flushed', 'flushed')]
    forward_passes()  # warm-up: allocations, lazy initialisation
    for kind, setting in tqdm(jobs, disable=not progress, desc='denormals'):
        with denormals_flushed(setting == 'flushed'):
            start = time.perf_counter()
            (training_steps if kind == 'train' else forward_passes)()
            times[kind][setting].append(
                (time.perf_counter() - start) / len(batches) * 1e3)
    moments = [value for per_parameter in state['optimizer']['state'].values()
               for value in per_parameter.values()]
    result = {'run': description, 'meshes': len(batches), 'repeats': repeats,
              'threads': torch.get_num_threads(),
              'denormal_weights': denormal_count(state['model'].values()),
              'denormal_adam_moments': denormal_count(moments)}
    for kind, settings in times.items():
        medians = {setting: statistics.median(values)
                   for setting, values in settings.items()}
        result[kind] = {'ms_per_mesh': medians,
                        'slowdown': medians['not flushed'] / medians['flushed']}
    return result


def markdown(result: dict) -> str:
    weights, moments = result['denormal_weights'], result['denormal_adam_moments']
    lines = [f"{result['run']}: {result['meshes']} training meshes, median of "
             f"{result['repeats']}, {result['threads']} thread(s); denormal "
             f"weights {weights[0]} of {weights[1]}, Adam moments {moments[0]} "
             f"of {moments[1]}", '',
             '| pass | ms per mesh, flushed | not flushed | slowdown |',
             '|---|---|---|---|']
    for kind, name in (('train', 'training step'), ('eval', 'evaluation')):
        ms = result[kind]['ms_per_mesh']
        lines.append(f"| {name} | {ms['flushed']:.1f} | {ms['not flushed']:.1f} "
                     f"| {result[kind]['slowdown']:.2f}x |")
    return '\n'.join(lines) + '\n'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('run')
    parser.add_argument('--meshes', type=int, default=16)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--out', default='denormal-steps')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = measure(args.run, args.meshes, args.repeats)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / 'denormal_steps.json').write_text(json.dumps(result, indent=1))
    (out / 'denormal_steps.md').write_text(markdown(result))
    print(markdown(result))


if __name__ == '__main__':
    main()
