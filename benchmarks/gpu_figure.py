"""The GPU readings as one figure: time ratios to the baseline of the same
run, per GPU session, from the suite's committed results.

    python -m benchmarks.gpu_figure [--out docs/results/gpu/ratios.png]
        [RESULTS_DIR ...]

Left: ``MetricAttentionConv(backend='triton')`` against ``GATConv``, one
layer's forward and backward in float32, eager, by graph size. Right:
``MetricMultiheadAttention`` against dot-product MHA (bf16, forward and
backward) by sequence length. Each session's ratios come from its own
``gpu.json`` (``python -m benchmarks.run --suite gpu``); a cell that session
did not run is left out.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / 'results'
#: The sessions drawn by default, oldest first: (folder, label).
SESSIONS = (('gpu-2026-11-26', 'H100, 2026-11-26'),
            ('gpu-2026-11-27', 'H200, 2026-11-27, first lease'),
            ('gpu-2026-11-27-second', 'H200, 2026-11-27, second lease'))
#: Graph sizes (nodes, edges) of the sparse panel and their labels.
GRAPHS = ((2708, 10556, 'Cora size'), (19717, 88648, 'PubMed size'),
          (169343, 1166243, 'ogbn-arxiv size'), (100000, 2000000, '100k / 2M'),
          (1000000, 20000000, '1M / 20M'))
LENGTHS = (1024, 4096, 16384)


def medians(results: list[dict]) -> dict[tuple, float]:
    """Median seconds per step of every ``ok`` row, keyed by ``(kind,
    variant, size, dtype, mode)``; a later row of the same key (a resumed
    call) replaces an earlier one."""
    table = {}
    for row in results:
        case = row['case']
        if (row.get('status') != 'ok' or 'median_s' not in row
                or case.get('graph', 'uniform') != 'uniform'):
            continue
        size = ((case['nodes'], case['edges']) if case['kind'] == 'sparse'
                else case.get('length'))
        table[case['kind'], case['variant'], size, case.get('dtype'),
              row.get('mode')] = row['median_s']
    return table


def ratios(table: dict[tuple, float], kind: str, variant: str, baseline: str,
           sizes: list, dtype: str) -> list[float | None]:
    """``variant / baseline`` fwd+bwd time per size (``None``: not run)."""
    out = []
    for size in sizes:
        key = (kind, variant, size, dtype, 'forward_backward')
        base = (kind, baseline, size, dtype, 'forward_backward')
        out.append(table[key] / table[base] if key in table and base in table
                   else None)
    return out


def plot(sessions: list[tuple[Path, str]], out: Path) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    graphs = [(nodes, edges) for nodes, edges, _ in GRAPHS]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2),
                                      gridspec_kw={'width_ratios': [5, 3]})
    width = 0.8 / len(sessions)
    for index, (folder, label) in enumerate(sessions):
        table = medians(json.loads((folder / 'gpu.json').read_text())['results'])
        for axis, values, count in (
                (left, ratios(table, 'sparse', 'metric-triton', 'GATConv',
                              graphs, 'float32'), len(graphs)),
                (right, ratios(table, 'dense-module', 'mha-metric', 'mha-dot',
                               list(LENGTHS), 'bfloat16'), len(LENGTHS))):
            xs = [i + (index - (len(sessions) - 1) / 2) * width
                  for i in range(count)]
            shown = [(x, v) for x, v in zip(xs, values, strict=True)
                     if v is not None]
            bars = axis.bar([x for x, _ in shown], [v for _, v in shown],
                            width, label=label, color=f'C{index}')
            axis.bar_label(bars, fmt='%.2f', fontsize=7, padding=1)
    left.set_xticks(range(len(GRAPHS)), [name for *_, name in GRAPHS])
    left.set_title('MetricAttentionConv (Triton) / GATConv, fwd+bwd, float32',
                   fontsize=10)
    right.set_xticks(range(len(LENGTHS)), [f'L = {n}' for n in LENGTHS])
    right.set_title('MetricMultiheadAttention / dot MHA, fwd+bwd, bf16',
                    fontsize=10)
    for axis in (left, right):
        axis.axhline(1.0, color='black', linewidth=0.8)
        axis.set_ylabel('time ratio (below 1: faster)')
        axis.grid(axis='y', alpha=0.3)
    left.legend(fontsize=8, loc='upper right')
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('folders', nargs='*', type=Path,
                        help='results folders with a gpu.json (default: the '
                             'committed sessions)')
    parser.add_argument('--out', type=Path,
                        default=Path('docs/results/gpu/ratios.png'))
    args = parser.parse_args(argv)
    sessions = ([(folder, folder.name) for folder in args.folders]
                or [(RESULTS / name, label) for name, label in SESSIONS])
    plot(sessions, args.out)
    print(args.out)


if __name__ == '__main__':
    main()
