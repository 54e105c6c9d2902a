"""Can a trained human_seg model be taught to predict on a Loop-subdivided
mesh what it predicts on the original? The run is fine-tuned, once per
weight ``lam`` of ``--lams`` and each time from its checkpoint, with the
loss it trained with plus, on every step that draws a mesh's
Loop-subdivided training copy, ``lam`` times the consistency term

    KL( softmax(teacher) || softmax(student) ), averaged over the copy's vertices,

the student the model's vertex logits on the copy, the teacher its own
(eval mode, no gradient) on the original mesh carried to the copy (the
original vertices keep theirs, each added vertex takes the mean of its
edge's two ends: the logits of a model that subdivision does not change,
:func:`~pyg_metric_attn.experiments.human_seg_robust.carried`). ``lam = 0``
is the control: the same extra training without the term. Steps draw as
the run's training did (each training mesh once per epoch, itself or one
of its ``-o augment_copies`` copies, uniformly; one mesh per step), with
Adam at the run's weight decay and a learning rate annealed from ``--lr``
to 0 over the steps (cosine). The run must have trained on subdivided
copies (``-o augment_perturbations=subdivision,...``).

Each fine-tuned model is then scored as ``experiment human_seg_robust``
scores a run (perturbation seed 0) on the ``--split`` meshes, with the
term's mean on their subdivided copies (does the consistency learnt on the
training copies hold on unseen meshes?).

    python -m benchmarks.mesh_subdivision_consistency RUN [--lams 0,10,100] \\
        [--epochs 10] [--lr 3e-4] [--split val|test] [--seed 0] \\
        [--perturbations subdivision,decimation,jitter] [--out FOLDER] [--threads 1]

Writes ``consistency.md``, ``consistency.json`` and ``consistency.png`` to
``--out``.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch_geometric.data import Batch, Data
from tqdm.auto import tqdm

from benchmarks.mesh_feature_drift import parse_arguments
from pyg_metric_attn.datasets import PerturbedMeshes
from pyg_metric_attn.experiments.human_seg_robust import (
    carried,
    score,
    split_meshes,
)
from pyg_metric_attn.experiments.run_folder import load_run
from pyg_metric_attn.geometry import PERTURBATIONS
from pyg_metric_attn.training import seed_everything
from pyg_metric_attn.utils.denormals import denormals_flushed


def consistency_term(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """``KL(softmax(teacher) || softmax(student))`` per vertex, averaged over
    the vertices of the logits ``[N, classes]``; 0 where they agree up to a
    constant per vertex."""
    if student.shape != teacher.shape:
        raise ValueError(f"student and teacher logits differ in shape: "
                         f"{tuple(student.shape)} and {tuple(teacher.shape)}")
    return F.kl_div(F.log_softmax(student, -1), F.log_softmax(teacher, -1),
                    log_target=True, reduction='batchmean')


def subdivided_source(training_set: Any) -> int:
    """The index, among the training set's sources (the meshes, then their
    copies), of the Loop-subdivided copies of seed 0."""
    for index, source in enumerate(getattr(training_set, 'sources', ())):
        if (isinstance(source, PerturbedMeshes)
                and source.perturbation == 'subdivision' and source.seed == 0):
            return index
    raise ValueError("The run drew no Loop-subdivided training copies: train "
                     "it with '-o augment_copies=1 -o augment_perturbations="
                     "subdivision,...'")


def teacher_logits(task: Any, model: torch.nn.Module, mesh: Data,
                   copy: Data) -> torch.Tensor:
    """The model's vertex logits on the original ``mesh`` (eval mode, no
    gradient) carried to its subdivided ``copy`` (on the CPU)."""
    return carried(task.vertex_scores(model, mesh), copy, mesh)


def fine_tune(task: Any, model: torch.nn.Module, lam: float, epochs: int,
              lr: float, seed: int = 0, progress: bool = True
              ) -> list[dict[str, float]]:
    """Fine-tune ``model`` in place (module docstring); one row per epoch:
    ``loss`` (mean per step), ``consistency`` (the term's mean on the
    subdivided steps, also with ``lam = 0``) and ``subdivided_steps``."""
    if not lam >= 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    training_set = task.augmented(task.datasets()[0])
    subdivided = subdivided_source(training_set)
    seed_everything(seed)
    optimizer = task.build_optimizer(model)
    for group in optimizer.param_groups:
        group['lr'] = lr
    steps = max(epochs * len(training_set), 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / steps)))
    history = []
    bar = tqdm(total=epochs * len(training_set), disable=not progress,
               desc=f'fine-tune, lam {lam:g}')
    with denormals_flushed():
        for epoch in range(1, epochs + 1):
            history.append({'epoch': epoch, **_epoch(
                task, model, lam, training_set, subdivided, optimizer,
                scheduler, bar)})
    bar.close()
    return history


def _epoch(task: Any, model: torch.nn.Module, lam: float, training_set: Any,
           subdivided: int, optimizer: torch.optim.Optimizer,
           scheduler: Any, bar: Any) -> dict[str, float]:
    """One epoch of :func:`fine_tune`."""
    total, terms = 0.0, []
    for index in torch.randperm(len(training_set)).tolist():
        choice, data = training_set.draw(index)
        batch = task.placement.move(Batch.from_data_list([data]))
        model.train()
        logits = task.forward(model, batch, augment=True)
        loss = task.label_loss(logits, batch)
        if choice == subdivided:
            term = consistency_term(logits, task.placement.move(teacher_logits(
                task, model, training_set.sources[0][index], data)))
            terms.append(float(term.detach()))
            if lam:
                loss = loss + lam * term
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        total += float(loss.detach())
        bar.update()
    return dict(loss=total / len(training_set),
                consistency=sum(terms) / max(len(terms), 1),
                subdivided_steps=len(terms))


def mean_consistency(task: Any, model: torch.nn.Module, meshes: Any,
                     copies: Any) -> float:
    """The consistency term's mean over ``meshes`` and their subdivided
    ``copies``, the model in eval mode."""
    terms = [float(consistency_term(task.vertex_scores(model, copy),
                                    teacher_logits(task, model, mesh, copy)))
             for mesh, copy in zip(meshes, copies, strict=True)]
    return sum(terms) / len(terms)


def consistency_readings(run: str, lams: list[float], epochs: int, lr: float,
                         split: str, perturbations: list[str], seed: int = 0,
                         progress: bool = True) -> dict[str, Any]:
    """``{lam: {'history', 'rows', 'consistency'}}`` (as text keys): each
    fine-tuned model's epochs, its ``human_seg_robust`` rows on ``split``
    and the term's mean on that split's subdivided copies."""
    readings = {}
    for lam in lams:
        task, model, description = load_run(
            run, 'human_seg', {}, command='mesh_subdivision_consistency',
            device='cuda' if torch.cuda.is_available() else 'cpu')
        print(description, f'lam {lam:g}')
        history = fine_tune(task, model, lam, epochs, lr, seed, progress)
        model.eval()
        rows = score(task, model, perturbations, 0, split=split,
                     progress=progress)
        meshes = split_meshes(task, split)
        copies = PerturbedMeshes(Path(meshes.processed_root) / 'robustness',
                                 meshes, 'subdivision', 0,
                                 pre_transform=task.preprocessing, log=progress)
        readings[f'{lam:g}'] = dict(
            history=history, rows=rows,
            consistency=mean_consistency(task, model, meshes, copies))
    return readings


def markdown(readings: dict[str, Any], run: str, split: str, epochs: int,
             lr: float) -> str:
    """One row per ``lam``: the term on the last epoch's training copies and
    on the split's subdivided copies, the accuracy and every drop."""
    kinds = [row['perturbation'] for row in
             next(iter(readings.values()))['rows'][1:]]
    lines = [f'{Path(run).name} fine-tuned {epochs} epochs (lr {lr:g}, '
             f'cosine) with lam x the subdivision consistency term; {split} '
             'meshes: accuracy (%), drops (points, perturbation seed 0), '
             'subdivision readout floor and drop at the original faces.', '',
             '| lam | term, training copies (last epoch) | term, ' + split +
             ' copies | original % | ' + ' | '.join(kinds) +
             ' | subdivision floor | subdivision at the original faces |',
             '|---|---|---|---|' + '---|' * (len(kinds) + 2)]
    for lam, reading in readings.items():
        rows = {row['perturbation']: row for row in reading['rows']}
        subdivision = rows.get('subdivision', {})
        extra = [subdivision.get('readout_floor'),
                 subdivision.get('source_drop')]
        lines.append(
            f"| {lam} | {reading['history'][-1]['consistency']:.4f} | "
            f"{reading['consistency']:.4f} | "
            f"{100 * rows['original']['face_acc']:.2f} | "
            + ' | '.join(f"{rows[kind]['drop']:.2f}" for kind in kinds) + ' | '
            + ' | '.join('-' if value is None else f'{value:.2f}'
                         for value in extra) + ' |')
    return '\n'.join(lines) + '\n'


def plot(readings: dict[str, Any], path: Path) -> None:
    """The term on the training copies per epoch, and the drops per
    ``lam``."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, (term_axes, drop_axes) = plt.subplots(1, 2, figsize=(11, 4))
    for lam, reading in readings.items():
        term_axes.plot([row['epoch'] for row in reading['history']],
                       [row['consistency'] for row in reading['history']],
                       marker='o', label=f'lam {lam}')
    term_axes.set(xlabel='fine-tuning epoch',
                  ylabel='consistency term, training copies')
    lams = list(readings)
    kinds = [row['perturbation'] for row in readings[lams[0]]['rows'][1:]]
    for kind in kinds:
        drop_axes.plot(range(len(lams)), [
            next(row['drop'] for row in readings[lam]['rows']
                 if row['perturbation'] == kind) for lam in lams],
            marker='o', label=kind)
    drop_axes.set_xticks(range(len(lams)), [f'lam {lam}' for lam in lams])
    drop_axes.set(ylabel='drop (points)')
    for axes in (term_axes, drop_axes):
        axes.legend(fontsize=7)
    fig.suptitle('human_seg: fine-tuned with a subdivision consistency term')
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    args, perturbations = parse_arguments(
        __doc__, 'subdivision,decimation,jitter',
        'runs/mesh_subdivision_consistency', PERTURBATIONS,
        **{'--split': dict(choices=('test', 'val'), default='val'),
           '--lams': dict(default='0,10,100',
                          help='weights of the term, comma-separated'),
           '--epochs': dict(type=int, default=10),
           '--lr': dict(type=float, default=3e-4),
           '--seed': dict(type=int, default=0,
                          help='seed of the fine-tuning draws')})
    if len(args.runs) != 1:
        raise SystemExit('Give one run: each lam fine-tunes it anew')
    lams = [float(lam) for lam in args.lams.split(',')]
    readings = consistency_readings(args.runs[0], lams, args.epochs, args.lr,
                                    args.split, perturbations, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(readings, args.runs[0], args.split, args.epochs, args.lr)
    (out / 'consistency.md').write_text(table)
    (out / 'consistency.json').write_text(json.dumps(
        dict(run=args.runs[0], split=args.split, epochs=args.epochs,
             lr=args.lr, seed=args.seed, lams=readings), indent=1))
    plot(readings, out / 'consistency.png')
    print(table)


if __name__ == '__main__':
    main()
