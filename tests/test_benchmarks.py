"""The benchmark harness: a measured case, out-of-memory and timeout cells
instead of crashes, and the ratio table (no timing is asserted)."""
from __future__ import annotations

import argparse

from benchmarks.cases import dense_attention
from benchmarks.run import markdown_table, run_one
from benchmarks.targets import TARGET_GRAPH, sparse_rows, table


def options(**overrides):
    defaults = dict(threads=1, device='cpu', repeats=5, timeout=120.0,
                    memory_gib=14.0)
    return argparse.Namespace(**(defaults | overrides))


SMALL = dict(suite='sparse', variant='metric-fused', nodes=50, degree=4, heads=2,
             channels=8)


def test_a_case_is_measured_in_a_fresh_process():
    result = run_one(SMALL, 'forward_backward', options())
    assert result['status'] == 'ok', result
    assert len(result['times_s']) >= 5
    assert min(result['times_s']) <= result['median_s'] <= max(result['times_s'])
    assert result['peak_mib'] >= result['baseline_mib'] > 50


def test_out_of_memory_and_timeout_become_cells():
    # 8 x 8 x 4096 x 4096 float32 logits are 4 GiB: over a 3 GiB cap.
    naive = dict(suite='dense', variant='naive-cdist', length=4096, batch=8,
                 heads=8, head_dim=64)
    assert run_one(naive, 'forward', options(memory_gib=3.0))['status'] == 'OOM'
    assert run_one(SMALL, 'forward', options(timeout=0.05))['status'] == 'timeout'


def test_dense_variants_agree():
    import torch
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 8, generator=g) + 4 for _ in range(3))
    expected = dense_attention('naive-cdist')(q, k, v)
    for variant in ('metric-sdpa', 'metric-key-bias', 'metric-augmented'):
        assert torch.allclose(dense_attention(variant)(q, k, v), expected,
                              atol=1e-5)


def test_markdown_table_has_ratios_to_the_baseline_and_failure_cells():
    def result(variant, mode, status='ok', seconds=0.0):
        case = dict(suite='sparse', variant=variant, nodes=10, degree=2,
                    heads=1, channels=8)
        return dict(case=case, mode=mode, status=status, median_s=seconds)

    results = [result('GATConv', 'forward', seconds=0.2),
               result('metric-fused', 'forward', seconds=0.05),
               result('GATConv', 'forward_backward', status='OOM'),
               result('metric-fused', 'forward_backward', seconds=0.1)]
    table = markdown_table(results, 'GATConv', 'median_s', 1e3, 1).splitlines()
    assert table[0] == ('| degree | heads | nodes | mode | GATConv | '
                        'metric-fused |')
    assert table[2] == '| 2 | 1 | 10 | forward | 200.0 (1.00x) | 50.0 (0.25x) |'
    assert table[3] == '| 2 | 1 | 10 | forward_backward | OOM | 100.0 |'


def test_targets_table_marks_met_and_missed_bounds():
    def result(variant, seconds, memory, status='ok'):
        return dict(case=dict(suite='sparse', variant=variant, **TARGET_GRAPH),
                    mode='forward_backward', status=status, median_s=seconds,
                    peak_over_baseline_mib=memory, peak_mib=memory + 300)

    results = [result('GATConv', 1.0, 1000.0), result('metric-fused', 0.3, 500.0),
               result('TransformerConv', 2.0, 0.0),
               result('metric-scatter', 2.5, 0.0), result('l2-fused', 0, 0, 'OOM')]
    lines = table(sparse_rows(results)).splitlines()
    assert '| metric-fused fwd+bwd time / GATConv | 0.30 | <= 0.5 | yes |' in lines
    assert ('| metric-fused fwd+bwd peak memory over baseline / GATConv | 0.50 | '
            '<= 0.33 | **no** |') in lines
    assert ('| metric-scatter fwd+bwd time / TransformerConv | 1.25 | <= 1 | '
            '**no** |') in lines
    assert any(line.startswith('| l2-fused fwd+bwd time / GATConv | not measured')
               for line in lines)
