"""Figures and summary table of an experiment's runs."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pyg_metric_attn.experiments.task import Task
from pyg_metric_attn.utils.io import atomic_write_json, atomic_write_text
from pyg_metric_attn.utils.optional import needs_extra
from pyg_metric_attn.visualization import file_figure

with needs_extra('experiments'):
    import matplotlib


def summarise(task: Task, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per attention: final-metric statistics and timings (:obj:`None` where
    no run finished), failed seeds and their errors."""
    summary: dict[str, Any] = {}
    for attention in dict.fromkeys(r['attention'] for r in records):
        runs = [r for r in records if r['attention'] == attention]
        ok = [r for r in runs if r['status'] == 'ok']
        failed = [r for r in runs if r['status'] != 'ok']
        summary[attention] = {
            'runs': len(ok),
            'failed_seeds': [r['seed'] for r in failed],
            'errors': [r['error'] for r in failed],
            **dict.fromkeys(('mean', 'std', 'best', 'worst', 'seconds_per_epoch',
                             'seconds_per_run')),
        }
        if not ok:
            continue
        values = np.array([r['final'][task.final_metric] for r in ok], dtype=float)
        high, low = values.max(), values.min()
        summary[attention].update(
            mean=float(values.mean()),
            std=float(values.std(ddof=1)) if len(values) > 1 else 0.0,
            best=float(high if task.higher_is_better else low),
            worst=float(low if task.higher_is_better else high),
            seconds_per_epoch=float(np.mean([row['epoch_seconds'] for r in ok
                                             for row in r['history']])),
            seconds_per_run=float(np.mean([r['wall_seconds'] for r in ok])))
    return summary


def _fmt(metric: str, value: float) -> str:
    if 'acc' in metric:
        return f'{100 * value:.2f}'
    return f'{value:.4g}'


def summary_table(task: Task, summary: dict[str, Any]) -> str:
    """A Markdown table of :func:`summarise`'s result."""
    metric = task.final_metric
    unit = ' (%)' if 'acc' in metric else ''
    lines = [f'| attention | runs | {metric}{unit} mean ± std | best | worst '
             f'| s/epoch | s/run |',
             '|---|---|---|---|---|---|---|']
    for attention, s in summary.items():
        runs = f"{s['runs']}" + (f" ({len(s['failed_seeds'])} failed)"
                                 if s['failed_seeds'] else '')
        if not s['runs']:
            lines.append(f'| {attention} | {runs} | failed | | | | |')
            continue
        lines.append(
            f"| {attention} | {runs} | {_fmt(metric, s['mean'])} ± "
            f"{_fmt(metric, s['std'])} | {_fmt(metric, s['best'])} | "
            f"{_fmt(metric, s['worst'])} | {s['seconds_per_epoch']:.3f} | "
            f"{s['seconds_per_run']:.1f} |")
    return '\n'.join(lines) + '\n'


def plot_curves(task: Task, records: Sequence[dict[str, Any]], path: Path) -> None:
    """Per-epoch curves: mean over seeds with a min-max band per attention."""
    metrics = list(task.curve_metrics)
    attentions = list(dict.fromkeys(r['attention'] for r in records))
    # One colour per attention, also beyond matplotlib's ten default ones.
    palette = matplotlib.colormaps['tab10' if len(attentions) <= 10 else 'tab20']
    fig = file_figure(figsize=(5 * len(metrics), 3.8))
    axes = fig.subplots(1, len(metrics), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        for index, attention in enumerate(attentions):
            curves = [[row[metric] for row in r['history'] if metric in row]
                      for r in records
                      if r['attention'] == attention and r['status'] == 'ok']
            curves = [c for c in curves if c]
            if not curves:
                continue
            length = min(len(c) for c in curves)  # early stopping may differ
            values = np.array([c[:length] for c in curves], dtype=float)
            epochs = np.arange(1, length + 1)
            color = palette(index % palette.N)
            ax.plot(epochs, values.mean(0), label=attention, color=color)
            ax.fill_between(epochs, values.min(0), values.max(0), alpha=0.2,
                            color=color)
        ax.set_xlabel('epoch')
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize='small')
    fig.suptitle(f'{task.name}: mean over seeds, band = min to max')
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot_violin(task: Task, records: Sequence[dict[str, Any]], path: Path) -> None:
    """Violin plot of the final metric per attention, seeds as dots."""
    metric = task.final_metric
    groups = {}
    for attention in dict.fromkeys(r['attention'] for r in records):
        values = [r['final'][metric] for r in records
                  if r['attention'] == attention and r['status'] == 'ok']
        if values:
            groups[attention] = values
    fig = file_figure(figsize=(1.6 * max(len(groups), 2) + 1, 3.8))
    ax = fig.subplots()
    if groups:
        positions = np.arange(1, len(groups) + 1)
        # A violin needs spread; seeds that all agree are shown as dots only.
        spread = [i for i, v in enumerate(groups.values()) if np.ptp(v) > 0]
        if spread:
            ax.violinplot([list(groups.values())[i] for i in spread],
                          positions=positions[spread], showmeans=True)
        for position, values in zip(positions, groups.values(), strict=True):
            jitter = np.random.default_rng(0).uniform(-0.08, 0.08, len(values))
            ax.scatter(position + jitter, values, s=10, color='k', zorder=3)
        ax.set_xticks(positions, list(groups))
    ax.set_ylabel(f'final {metric}')
    ax.set_title(f'{task.name}: final {metric} over seeds')
    ax.grid(alpha=0.3, axis='y')
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_report(task: Task, records: Sequence[dict[str, Any]],
                 out_dir: Path) -> dict[str, Any]:
    """Write ``summary.json``, ``summary.md`` and, where some run finished,
    ``curves.png`` and ``violin.png`` (else earlier figures are removed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarise(task, records)
    atomic_write_json(out_dir / 'summary.json', summary)
    atomic_write_text(out_dir / 'summary.md', summary_table(task, summary))
    figures = {'curves.png': plot_curves, 'violin.png': plot_violin}
    finished = any(r['status'] == 'ok' for r in records)
    for name, plot in figures.items():
        if finished:
            plot(task, records, out_dir / name)
        else:
            (out_dir / name).unlink(missing_ok=True)
    return summary
