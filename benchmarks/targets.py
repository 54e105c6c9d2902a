"""Check the issue's CPU targets against measured benchmark results.

    python -m benchmarks.targets [--results benchmarks/results]

Reads ``sparse.json`` and ``dense.json`` written by :mod:`benchmarks.run` and
prints a Markdown table: target, measured value, met or not. Ratios compare
numbers from the same run.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

# The target configuration of the sparse suite (10k nodes / 200k edges).
TARGET_GRAPH = dict(nodes=10_000, degree=20, heads=4, channels=64)


def lookup(results: list[dict[str, Any]], mode: str, **case: Any) -> dict | None:
    for result in results:
        if result['mode'] == mode and all(result['case'].get(k) == v
                                          for k, v in case.items()):
            return result
    return None


def ratio(results: list[dict[str, Any]], key: str, mode: str,
          numerator: dict[str, Any], denominator: dict[str, Any]) -> float | None:
    top, bottom = (lookup(results, mode, **numerator),
                   lookup(results, mode, **denominator))
    if top is None or bottom is None or top['status'] != 'ok' or \
            bottom['status'] != 'ok':
        return None
    return top[key] / bottom[key]


def sparse_rows(results: list[dict[str, Any]]) -> list[tuple[str, float | None,
                                                             str, float]]:
    """``(description, measured, comparison, bound)`` rows."""
    mode = 'forward_backward'
    gat = dict(TARGET_GRAPH, variant='GATConv')
    rows = []
    for metric in ('metric', 'l2', 'dot'):
        fused = dict(TARGET_GRAPH, variant=f'{metric}-fused')
        rows += [
            (f'{metric}-fused fwd+bwd time / GATConv', ratio(
                results, 'median_s', mode, fused, gat), '<=', 0.5),
            (f'{metric}-fused fwd+bwd peak memory over baseline / GATConv',
             ratio(results, 'peak_over_baseline_mib', mode, fused, gat),
             '<=', 0.33),
            (f'{metric}-fused fwd+bwd total peak RSS / GATConv', ratio(
                results, 'peak_mib', mode, fused, gat), '<=', 0.33),
        ]
    for metric in ('metric', 'l2', 'dot'):
        rows.append((f'{metric}-scatter fwd+bwd time / TransformerConv', ratio(
            results, 'median_s', mode, dict(TARGET_GRAPH,
                                            variant=f'{metric}-scatter'),
            dict(TARGET_GRAPH, variant='TransformerConv')), '<=', 1.0))
    return rows


def dense_rows(results: list[dict[str, Any]]) -> list[tuple[str, float | None,
                                                            str, float]]:
    rows = []
    for mode in ('forward', 'forward_backward'):
        rows.append((f'metric-sdpa / sdpa-dot time, L=1024, {mode}', ratio(
            results, 'median_s', mode, dict(variant='metric-sdpa', length=1024),
            dict(variant='sdpa-dot', length=1024)), '<=', 1.25))
        rows.append((f'naive-cdist / metric-sdpa time, L=4096, {mode}', ratio(
            results, 'median_s', mode, dict(variant='naive-cdist', length=4096),
            dict(variant='metric-sdpa', length=4096)), '>=', 4.0))
        for short, long in ((256, 1024), (1024, 4096)):
            rows.append((
                f'metric-sdpa memory growth L={short}->{long} (x{long // short} '
                f'length), {mode}',
                ratio(results, 'peak_over_baseline_mib', mode,
                      dict(variant='metric-sdpa', length=long),
                      dict(variant='metric-sdpa', length=short)),
                '<=', float(long // short)))
    return rows


def table(rows: list[tuple[str, float | None, str, float]]) -> str:
    lines = ['| target | measured | bound | met |', '|---|---|---|---|']
    for description, value, comparison, bound in rows:
        if value is None:
            lines.append(f'| {description} | not measured (OOM/timeout/absent) '
                         f'| {comparison} {bound:g} | no |')
            continue
        met = value <= bound if comparison == '<=' else value >= bound
        lines.append(f'| {description} | {value:.2f} | {comparison} {bound:g} | '
                     f'{"yes" if met else "**no**"} |')
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--results', type=Path,
                        default=Path(__file__).resolve().parent / 'results')
    args = parser.parse_args(argv)
    rows = []
    for name, make_rows in (('sparse', sparse_rows), ('dense', dense_rows)):
        path = args.results / f'{name}.json'
        if path.exists():
            rows += make_rows(json.loads(path.read_text())['results'])
    print(table(rows))


if __name__ == '__main__':
    main()
