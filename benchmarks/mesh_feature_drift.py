"""Where a trained human_seg model's features move when the test meshes are
made differently: for each perturbation that keeps the original vertices
(loop subdivision keeps them as its first vertices, moved by Loop's
smoothing; jitter, anisotropic scaling and rotation move them in place),
the change of the input features, of the features after each block (after
each step of a MetricMeshFormer block: diffusion, local attention, global
attention, FFN; and the two parts of its diffusion step, the diffused
channels and their spatial gradient features) and of the vertex logits, at
the original vertices, relative to the original's (``||h' - h|| / ||h||``
per mesh, averaged over the test meshes).

    python benchmarks/mesh_feature_drift.py RUN [RUN ...] \
        [--perturbations subdivision,jitter] [--out FOLDER]

``RUN``: folders written by ``pyg-metric-attn train human_seg`` (MetricMeshFormer
or DiffusionNet); the perturbed test meshes are those of ``experiment
human_seg_robust`` (seed 0), read from or written to the run's processed
folder. Writes ``drift.md``, ``drift.json`` and ``drift.png`` to ``--out``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from pyg_metric_attn.datasets import PerturbedMeshes
from pyg_metric_attn.experiments.human_seg_robust import split_meshes
from pyg_metric_attn.experiments.run_folder import load_run
from pyg_metric_attn.nn.models import DiffusionNet, MetricMeshFormer

#: Perturbations whose meshes keep the original vertices first, in order.
SAME_VERTICES = ('subdivision', 'anisotropic_scaling', 'jitter', 'rotation')
#: The LayerNorms in front of each step of a MetricMeshFormer block: their
#: input is the features after the step before.
FORMER_STEPS = (('norm_local', 'diffusion'), ('norm_global', 'local'),
                ('norm_ffn', 'global'))


def stage_features(task, model: torch.nn.Module, mesh) -> dict[str, torch.Tensor]:
    """The input features, the features after every block (and every step
    of a former block) and the logits of one mesh, by stage name."""
    stages = {'input': task.inputs(task.scaled(mesh))}
    hooks = []
    for b, block in enumerate(model.blocks):
        if isinstance(model, MetricMeshFormer):
            if block.gradient_features is not None:
                # The diffusion step's two parts, as its output map reads
                # them: the diffused channels and their gradient features.
                hooks.append(block.lin_diffusion.register_forward_pre_hook(
                    lambda module, args, b=b: stages.update(zip(
                        (f'{b}.diffused', f'{b}.gradient features'),
                        args[0].chunk(2, dim=-1), strict=True))))
            for norm, step in FORMER_STEPS:
                if getattr(block, norm) is not None:
                    hooks.append(getattr(block, norm).register_forward_hook(
                        lambda module, args, out, name=f'{b}.{step}':
                        stages.__setitem__(name, args[0])))
        hooks.append(block.register_forward_hook(
            lambda module, args, out, name=f'{b}.out':
            stages.__setitem__(name, out)))
    try:
        with torch.no_grad():
            stages['logits'] = task.forward(model, mesh)
    finally:
        for hook in hooks:
            hook.remove()
    return stages


def load(run: str, perturbations: list[str], split: str = 'test') -> tuple:
    """``(task, model, description, meshes of split, {perturbation:
    copies})`` of a run."""
    task, model, description = load_run(run, 'human_seg', {},
                                        command='mesh_feature_drift')
    if not isinstance(model, (MetricMeshFormer, DiffusionNet)):
        raise ValueError(f"'{run}' is not a MetricMeshFormer or DiffusionNet run")
    model.eval()
    test = split_meshes(task, split)
    root = Path(test.processed_root) / 'robustness'
    copies = {perturbation: PerturbedMeshes(
        root, test, perturbation, 0, pre_transform=task.preprocessing,
        num_workers=task.config.num_workers, log=False)
        for perturbation in perturbations}
    return task, model, description, test, copies


def drift(run: str, perturbations: list[str]
          ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """``(features, meshes)`` of one run: ``{perturbation: {stage: mean
    relative change}}`` of its features, and ``{perturbation: {quantity:
    mean relative change}}`` of its test meshes, the surface area (the sum
    of the lumped vertex masses) and the largest eigenvalue of the
    operators' Laplacian spectrum."""
    task, model, description, test, copies = load(run, perturbations)
    originals = [stage_features(task, model, mesh) for mesh in test]
    features, meshes = {}, {}
    for perturbation in perturbations:
        pairs = list(zip(test, copies[perturbation], strict=True))
        changes: dict[str, list[float]] = {}
        for original, copy in tqdm(
                list(zip(originals, copies[perturbation], strict=True)),
                desc=f'{Path(run).name} {perturbation}'):
            moved = stage_features(task, model, copy)
            count = original['input'].size(0)
            for name, values in original.items():
                change = (moved[name][:count] - values).norm() / values.norm()
                changes.setdefault(name, []).append(float(change))
        features[perturbation] = {name: float(np.mean(values))
                                  for name, values in changes.items()}
        meshes[perturbation] = {
            'area': float(np.mean([float(b.mass.sum() / a.mass.sum()) - 1
                                   for a, b in pairs])),
            'largest eigenvalue': float(np.mean(
                [float(b.evals[..., -1].max() / a.evals[..., -1].max()) - 1
                 for a, b in pairs]))}
    print(description)
    return features, meshes


def parse_arguments(description: str, perturbations: str, out: str,
                    allowed: tuple[str, ...] = SAME_VERTICES,
                    **extra: dict) -> tuple[argparse.Namespace, list[str]]:
    """The arguments of a script that reads trained runs on perturbed meshes
    (by default those with their original vertices): ``RUN [RUN ...]``,
    ``--perturbations`` (default ``perturbations``; checked to be of
    ``allowed``), ``--out`` (default ``out``), ``--threads`` (set), and
    ``extra`` options (``{flag: add_argument keywords}``)."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument('runs', nargs='+', metavar='RUN')
    for flag, options in extra.items():
        parser.add_argument(flag, **options)
    parser.add_argument('--perturbations', default=perturbations,
                        help=f"comma-separated, of {', '.join(allowed)}")
    parser.add_argument('--out', default=out)
    parser.add_argument('--threads', type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = args.perturbations.split(',')
    unknown = sorted(set(names) - set(allowed))
    if unknown:
        parser.error(f"{unknown}: only {', '.join(allowed)} can be read here")
    return args, names


def stage_names(results: dict[str, dict[str, dict[str, float]]],
                perturbation: str) -> list[str]:
    """Every run's stages of ``perturbation``, in order of appearance."""
    names = {name: None for result in results.values()
             for name in result[perturbation]}
    return list(names)


def main() -> None:
    args, perturbations = parse_arguments(
        __doc__, 'subdivision,jitter', 'runs/mesh_feature_drift')
    results, meshes = {}, None
    for run in args.runs:  # the same test meshes for every run
        results[run], meshes = drift(run, perturbations)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ['Relative change of the test meshes (mean over the meshes):', '',
             '| perturbation | area | largest eigenvalue |', '|---|---|---|']
    lines += [f"| {p} | {m['area']:+.4f} | {m['largest eigenvalue']:+.4f} |"
              for p, m in meshes.items()]
    lines += ['', 'Relative change of the features at the original vertices '
              '(mean over the test meshes).', '']
    for perturbation in perturbations:
        stages = stage_names(results, perturbation)
        lines += [f'{perturbation}:', '',
                  '| run | ' + ' | '.join(stages) + ' |',
                  '|---|' + '---|' * len(stages)]
        for run, result in results.items():
            row = result[perturbation]
            lines.append(f'| {Path(run).name} | '
                         + ' | '.join(f'{row[s]:.3f}' if s in row else '-'
                                      for s in stages) + ' |')
        lines.append('')
    (out / 'drift.md').write_text('\n'.join(lines))
    (out / 'drift.json').write_text(json.dumps(
        {'features': results, 'meshes': meshes}, indent=1))
    print('\n'.join(lines))

    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(perturbations), squeeze=False,
                             figsize=(6 * len(perturbations), 4))
    for ax, perturbation in zip(axes[0], perturbations, strict=True):
        stages = stage_names(results, perturbation)
        for run, result in results.items():
            row = result[perturbation]
            ax.plot([stages.index(s) for s in row], list(row.values()),
                    marker='o', label=Path(run).name)
        ax.set_xticks(range(len(stages)), stages, rotation=70, fontsize=7)
        ax.set_title(perturbation)
        ax.set_ylabel('relative change at the original vertices')
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / 'drift.png', dpi=120)


if __name__ == '__main__':
    main()
