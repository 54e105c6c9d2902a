"""The scale suite's plan, report and plot: full-batch training of a two-layer
graph model from 200k to 50M edges.

    python -m benchmarks.run --suite scale [--edges E ...] [--resume]
    python -m benchmarks.scale [--results benchmarks/results/scale.json]
        [--plot docs/results/graphs/scale.png]

:mod:`benchmarks.run` measures every cell (one variant on one graph) in a fresh
process under the memory cap and the timeout; before it starts a cell,
:func:`plan` predicts the cell's peak memory from the same variant on the
largest smaller graph of the same kind already measured, and skips the cell
(recording why) where that smaller graph ran out of memory or time, or where
the prediction is ``--skip-over-cap`` times the cap or more. This module turns
the results into bytes and nanoseconds per edge (:func:`report`) and a
log-log plot (:func:`plot`); run on its own it rewrites both from the results
file.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.cases import SCALE_BASELINE, SCALE_VARIANTS
from benchmarks.graphs import GRAPH_KINDS

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
# The goals: train this graph full batch while GATConv cannot (or
# needs >= 5x the memory); time per edge within 1.5x between these sizes.
TRAIN_EDGES = 20_000_000
FLAT_EDGES = (2_000_000, 50_000_000)


def input_mib(case: dict[str, Any]) -> float:
    """The inputs the process holds before the step: float32 features and
    the int64 ``edge_index``."""
    return (case['nodes'] * case['channels'] * 4 + case['edges'] * 16) / MIB


def _same_series(result: dict[str, Any], case: dict[str, Any]) -> bool:
    other = result['case']
    return (other.get('suite') == case['suite']
            and other['variant'] == case['variant']
            and other['graph'] == case['graph']
            and other['edges'] < case['edges'])


def plan(case: dict[str, Any], results: list[dict[str, Any]], cap_gib: float,
         timeout_s: float, skip_over_cap: float) -> dict[str, Any]:
    """``{'skip': reason or None, 'predicted_mib': peak RSS or None, 'basis':
    str}`` for ``case`` given the results so far.

    The prediction scales the step's memory (peak over the baseline) of the
    largest smaller graph of the same variant and kind by the ratio of edges
    and adds the larger inputs; it is only as good as memory being linear in
    the graph's size (the grid keeps the average degree at 20-25)."""
    series = [r for r in results if _same_series(r, case)]
    for result in sorted(series, key=lambda r: r['case']['edges']):
        limit_gib = result.get('memory_cap_gib', float('inf'))
        limit_s = result.get('timeout_s', float('inf'))
        if (result['status'] == 'OOM' and limit_gib >= cap_gib) or (
                result['status'] == 'timeout' and limit_s >= timeout_s):
            what = (f'over the {limit_gib:g} GiB cap' if result['status'] == 'OOM'
                    else f'over {limit_s:g} s')
            return dict(skip=f"{result['status']} at {short(result['case']['edges'])}"
                             f' edges ({what})', predicted_mib=None, basis='')
    measured = [r for r in series if r['status'] == 'ok']
    if not measured:
        return dict(skip=None, predicted_mib=None, basis='')
    ref = max(measured, key=lambda r: r['case']['edges'])
    step = ref['peak_over_baseline_mib'] * case['edges'] / ref['case']['edges']
    predicted = (ref['baseline_mib'] + input_mib(case) - input_mib(ref['case'])
                 + step)
    basis = (f"{bytes_per_edge(ref):.0f} B/edge at "
             f"{short(ref['case']['edges'])} edges")
    skip = None
    if predicted >= skip_over_cap * cap_gib * 1024:
        skip = (f'predicted {predicted / 1024:.0f} GiB ({basis}) >= '
                f'{skip_over_cap:g} x the {cap_gib:g} GiB cap')
    return dict(skip=skip, predicted_mib=predicted, basis=basis)


def bytes_per_edge(result: dict[str, Any]) -> float:
    """Peak memory the step adds over the process' baseline, per input edge."""
    return result['peak_over_baseline_mib'] * MIB / result['case']['edges']


def ns_per_edge(result: dict[str, Any]) -> float:
    """Median wall time per forward + backward step, per input edge."""
    return result['median_s'] * 1e9 / result['case']['edges']


def cpu_ns_per_edge(result: dict[str, Any]) -> float | None:
    """Median CPU time (all threads) per step, per input edge; None where
    the cell predates CPU timing."""
    if 'median_cpu_s' not in result:
        return None
    return result['median_cpu_s'] * 1e9 / result['case']['edges']


def short(n: int) -> str:
    for unit, scale in (('M', 10**6), ('k', 10**3)):
        if n >= scale and n % scale == 0:
            return f'{n // scale}{unit}'
    return str(n)


def _status(result: dict[str, Any] | None) -> str:
    if result is None:
        return 'not run'
    if result['status'] == 'OOM':
        return f"OOM (> {result.get('memory_cap_gib', '?'):g} GiB cap)"
    if result['status'] == 'timeout':
        return f"timeout (> {result.get('timeout_s', '?'):g} s)"
    if result['status'] == 'skipped':
        return f"skipped: {result.get('error', '')}"
    if result['status'] != 'ok':
        return f"{result['status']}: {result.get('error', '')[:80]}"
    return 'ok'


def _find(results: list[dict[str, Any]], variant: str, graph: str,
          edges: int) -> dict[str, Any] | None:
    return next((r for r in results if r['case']['variant'] == variant
                 and r['case']['graph'] == graph
                 and r['case']['edges'] == edges), None)


def _sizes(results: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return sorted({(r['case']['nodes'], r['case']['edges']) for r in results},
                  key=lambda size: size[1])


def cell_table(results: list[dict[str, Any]]) -> str:
    lines = ['| graph | nodes / edges | layer | status | peak over baseline, '
             'MiB | process peak, GiB | bytes/edge | s/step | ns/edge | '
             'CPU s/step | CPU ns/edge |',
             '|---|---|---|---|---|---|---|---|---|---|---|']
    for graph in GRAPH_KINDS:
        for nodes, edges in _sizes(results):
            for variant in SCALE_VARIANTS:
                result = _find(results, variant, graph, edges)
                if result is None:
                    continue
                cells = [graph, f'{short(nodes)} / {short(edges)}', variant,
                         _status(result)]
                if result['status'] == 'ok':
                    cpu = cpu_ns_per_edge(result)
                    cells += [f"{result['peak_over_baseline_mib']:.0f}",
                              f"{result['peak_mib'] / 1024:.2f}",
                              f'{bytes_per_edge(result):.0f}',
                              f"{result['median_s']:.2f}",
                              f'{ns_per_edge(result):.0f}',
                              '-' if cpu is None else
                              f"{result['median_cpu_s']:.2f}",
                              '-' if cpu is None else f'{cpu:.0f}']
                else:
                    cells += [''] * 7
                lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def growth_table(results: list[dict[str, Any]], key, digits: int = 0) -> str:
    """One row per (graph, layer), one column per size, then the growth from
    the second size and from the first to the largest measured."""
    sizes = _sizes(results)
    header = ['graph', 'layer'] + [short(e) for _, e in sizes] + [
        'largest / first', 'largest / second']
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for graph in GRAPH_KINDS:
        for variant in SCALE_VARIANTS:
            row = [_find(results, variant, graph, e) for _, e in sizes]
            if not any(row):
                continue
            values = [key(r) if r is not None and r['status'] == 'ok' else None
                      for r in row]
            cells = [f'{v:.{digits}f}' if v is not None else
                     '' if r is None else '-' if r['status'] == 'ok' else
                     r['status'] for v, r in zip(values, row, strict=True)]
            measured = [v for v in values if v is not None]
            growth = ['', '']
            if len(measured) >= 2 and values[0] is not None:
                growth[0] = f'{measured[-1] / values[0]:.2f}x'
            if len(values) > 1 and values[1] is not None and \
                    measured[-1] is not values[1]:
                growth[1] = f'{measured[-1] / values[1]:.2f}x'
            lines.append('| ' + ' | '.join([graph, variant] + cells + growth)
                         + ' |')
    return '\n'.join(lines)


def goals(results: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    """``(goal, measured, met)`` rows of the issue's two goals per graph:
    the metric layer trains :data:`TRAIN_EDGES` full batch while GATConv
    cannot (or needs >= 5x the memory), and its time per edge stays within
    1.5x between :data:`FLAT_EDGES` (wall and CPU time; where the larger
    graph did not run, the ratio at the largest graph that did is shown)."""
    rows = []
    metric = next(v for v in SCALE_VARIANTS if v != SCALE_BASELINE)
    for graph in GRAPH_KINDS:
        ours = _find(results, metric, graph, TRAIN_EDGES)
        gat = _find(results, SCALE_BASELINE, graph, TRAIN_EDGES)
        goal = (f'{graph} {short(TRAIN_EDGES)}: {metric} trains full batch, '
                f'{SCALE_BASELINE} cannot or needs >= 5x the memory')
        if ours is None or ours['status'] != 'ok':
            rows.append((goal, f'{metric}: {_status(ours)}', False))
        elif gat is not None and gat['status'] == 'ok':
            ratio = gat['peak_over_baseline_mib'] / ours['peak_over_baseline_mib']
            rows.append((goal, f'both ran; {SCALE_BASELINE} / {metric} step '
                               f'memory {ratio:.1f}x', ratio >= 5))
        elif gat is not None and gat['status'] in ('OOM', 'skipped'):
            measured = (f"{metric} ran in {ours['peak_mib'] / 1024:.1f} GiB "
                        f'(process peak); {SCALE_BASELINE}: {_status(gat)}')
            if gat.get('predicted_mib'):
                measured += (f", predicted {gat['predicted_mib'] / 1024:.1f} "
                             f"GiB ({gat['prediction_basis']}: "
                             f"{gat['predicted_mib'] / ours['peak_mib']:.1f}x)")
            rows.append((goal, measured, True))
        else:
            rows.append((goal, f'{SCALE_BASELINE}: {_status(gat)}', False))
        low, high = FLAT_EDGES
        first = _find(results, metric, graph, low)
        timed = sorted((r for r in results if r['case']['variant'] == metric
                        and r['case']['graph'] == graph
                        and low < r['case']['edges'] <= high
                        and r['status'] == 'ok'), key=lambda r: r['case']['edges'])
        for clock, key in (('wall', ns_per_edge), ('CPU', cpu_ns_per_edge)):
            goal = (f'{graph} {metric}: {clock} ns/edge at {short(high)} within '
                    f'1.5x of {short(low)}')
            if first is None or first['status'] != 'ok' or key(first) is None:
                rows.append((goal, f'{short(low)}: {_status(first)}', False))
                continue
            last = next((r for r in reversed(timed) if key(r) is not None), None)
            if last is None:
                rows.append((goal, 'no larger graph timed', False))
                continue
            ratio = key(last) / key(first)
            if last['case']['edges'] == high:
                rows.append((goal, f'{ratio:.2f}x', ratio <= 1.5))
            else:
                big = _find(results, metric, graph, high)
                rows.append((goal, f'{short(high)}: {_status(big)}; '
                                   f"{short(last['case']['edges'])} / "
                                   f'{short(low)}: {ratio:.2f}x', False))
    return rows


def report(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    first = results[0]['case']
    runs = meta.get('earlier_runs', []) + [meta]
    commands = '\n'.join(f"- `{run['command']}` ({run['date']}, "
                         f"{run['wall_min']:.1f} min, commit "
                         f"{run.get('commit') or 'not recorded'})"
                         for run in runs)
    return '\n\n'.join([
        f"## scale suite (TwoLayerNet: {first['channels']} channels, "
        f"{first['heads']} heads; forward + backward)",
        f"{meta['machine']}, torch {meta['torch']}, torch_geometric "
        f"{meta['torch_geometric']}, {meta['threads']} threads; memory cap "
        f"{meta['memory_gib']:g} GiB of address space per cell, timeout "
        f"{meta['timeout']:g} s. Runs:\n{commands}",
        'Bytes/edge: peak RSS over the process size after imports and inputs '
        '(the step\'s own memory), per input edge (the layers add one '
        'self-loop per node). Process peak: the whole process.',
        cell_table(results),
        '### Bytes per edge', growth_table(results, bytes_per_edge),
        '### Wall nanoseconds per edge', growth_table(results, ns_per_edge),
        '### CPU nanoseconds per edge (all threads)',
        growth_table(results, cpu_ns_per_edge),
        "### The issue's goals",
        '| goal | measured | met |\n|---|---|---|\n' + '\n'.join(
            f"| {goal} | {measured} | {'yes' if met else '**no**'} |"
            for goal, measured, met in goals(results))]) + '\n'


def plot(results: list[dict[str, Any]], path: Path, cap_gib: float) -> None:
    """Bytes and nanoseconds per edge against edges, log-log; an OOM cell is
    drawn at its lower bound (the cap over the edges), the cap as a line."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    from pyg_metric_attn.utils.io import atomic_writer

    figure, (memory, speed, cpu) = plt.subplots(1, 3, figsize=(15, 4.4))
    colours = dict(zip(SCALE_VARIANTS, ('tab:red', 'tab:blue'), strict=False))
    styles = dict(zip(GRAPH_KINDS, ('-', '--'), strict=True))
    for graph in GRAPH_KINDS:
        for variant in SCALE_VARIANTS:
            series = sorted((r for r in results if r['case']['graph'] == graph
                             and r['case']['variant'] == variant),
                            key=lambda r: r['case']['edges'])
            ok = [r for r in series if r['status'] == 'ok']
            label = f'{variant}, {graph}'
            style = dict(color=colours.get(variant), linestyle=styles[graph],
                         marker='o')
            if ok:
                edges = [r['case']['edges'] for r in ok]
                memory.plot(edges, [bytes_per_edge(r) for r in ok], label=label,
                            **style)
                speed.plot(edges, [ns_per_edge(r) for r in ok], label=label,
                           **style)
                timed = [r for r in ok if cpu_ns_per_edge(r) is not None]
                cpu.plot([r['case']['edges'] for r in timed],
                         [cpu_ns_per_edge(r) for r in timed], label=label,
                         **style)
            oom = [r for r in series if r['status'] == 'OOM']
            if oom:
                memory.scatter([r['case']['edges'] for r in oom],
                               [(r['memory_cap_gib'] * 1024 - r.get(
                                   'baseline_mib', 0)) * MIB / r['case']['edges']
                                for r in oom], marker='^', s=80,
                               color=colours.get(variant),
                               label=f'{variant}, {graph}: OOM (lower bound)')
    edges = sorted({r['case']['edges'] for r in results})
    if edges:
        memory.plot(edges, [cap_gib * 2**30 / e for e in edges], color='grey',
                    linestyle=':', label=f'{cap_gib:g} GiB / edges')
    for axes, unit in ((memory, 'peak memory over baseline, bytes per edge'),
                       (speed, 'wall time per fwd+bwd step, ns per edge'),
                       (cpu, 'CPU time (all threads) per step, ns per edge')):
        axes.set_xscale('log')
        axes.set_yscale('log')
        axes.set_xticks(edges, [short(e) for e in edges])
        axes.tick_params(axis='x', which='minor', bottom=False,
                         labelbottom=False)
        axes.set_xlabel('edges')
        axes.set_ylabel(unit)
        axes.grid(True, which='both', alpha=0.3)
    memory.legend(fontsize=7)
    speed.set_title('wall times under load from other processes: '
                    'indicative', fontsize=9)
    cpu.set_title('CPU time: less sensitive to that load', fontsize=9)
    figure.suptitle('Two-layer model, full batch, forward + backward (CPU)')
    figure.tight_layout()
    with atomic_writer(path) as file:
        figure.savefig(file, format='png', dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description='Rewrite the scale report and plot from its results.')
    parser.add_argument('--results', type=Path,
                        default=ROOT / 'benchmarks' / 'results' / 'scale.json')
    parser.add_argument('--plot', type=Path, default=ROOT / 'docs' / 'scale.png')
    args = parser.parse_args(argv)
    data = json.loads(args.results.read_text())
    from pyg_metric_attn.utils.io import atomic_write_text

    text = report(data['results'], data['meta'])
    atomic_write_text(args.results.with_suffix('.md'), text)
    plot(data['results'], args.plot, data['meta']['memory_gib'])
    print(text)


if __name__ == '__main__':
    main()
