"""The benchmark harness: a measured case, out-of-memory and timeout cells
instead of crashes, and the ratio table (no timing is asserted)."""
from __future__ import annotations

import argparse
import contextlib
import io

import pytest

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


def test_the_memory_cap_counts_above_what_the_imports_map():
    # torch and the cases map about 0.6 GiB here on import (a CUDA build of
    # torch: gigabytes, which a cap on the whole address space cut short on
    # the GPU machine); a small case fits in 0.5 GiB over that.
    result = run_one(SMALL, 'forward', options(memory_gib=0.5))
    assert result['status'] == 'ok', result


def test_dense_variants_agree():
    import torch
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 8, generator=g) + 4 for _ in range(3))
    expected = dense_attention('naive-cdist')(q, k, v)
    for variant in ('metric-sdpa', 'metric-key-bias', 'metric-augmented'):
        assert torch.allclose(dense_attention(variant)(q, k, v), expected,
                              atol=1e-5)
    narrow = dense_attention('naive-cdist')(q[..., 1:], k[..., 1:], v)
    assert torch.allclose(dense_attention('metric-sdpa-narrow')(q, k, v),
                          narrow, atol=1e-5)


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


# ------------------------------------------------------------- scale suite

def scale_result(variant, edges, status='ok', step_mib=100.0, seconds=1.0,
                 graph='uniform', **extra):
    case = dict(suite='scale', variant=variant, graph=graph,
                nodes=edges // 20, edges=edges, heads=4, channels=64)
    result = dict(case=case, mode='forward_backward', status=status,
                  memory_cap_gib=14.0, timeout_s=900.0, **extra)
    if status == 'ok':
        result.update(median_s=seconds, median_cpu_s=1.5 * seconds,
                      baseline_mib=400.0,
                      peak_mib=400.0 + step_mib, peak_over_baseline_mib=step_mib)
    return result


def test_scale_suite_measures_a_tiny_cell_and_resumes(tmp_path):
    import json

    from benchmarks.run import main
    # An earlier run measured GATConv: --resume keeps it, runs metric-fused.
    earlier = scale_result('GATConv', 1_000, step_mib=7.0)
    earlier['case'].update(nodes=100)
    (tmp_path / 'scale.json').write_text(json.dumps(dict(
        meta=dict(command='earlier', date='d', wall_min=1.0),
        results=[earlier])))
    main(['--suite', 'scale', '--tiny', '--edges', '1000', '--graphs',
          'uniform', '--threads', '1', '--resume', '--out', str(tmp_path)])
    data = json.loads((tmp_path / 'scale.json').read_text())
    gat, metric = data['results']
    assert gat == earlier
    assert metric['case']['variant'] == 'metric-fused'
    assert metric['status'] == 'ok' and metric['peak_reset'], metric
    assert metric['peak_over_baseline_mib'] > 0 and len(metric['times_s']) >= 2
    assert len(metric['cpu_times_s']) == len(metric['times_s'])
    assert metric['memory_cap_gib'] == 14.0
    assert data['meta']['earlier_runs'][0]['command'] == 'earlier'
    table = (tmp_path / 'scale.md').read_text()
    assert '| uniform | 100 / 1k | GATConv | ok | 7 | 0.40 | 7340 |' in table
    assert '| uniform | 100 / 1k | metric-fused | ok |' in table


def test_resume_keeps_final_results_and_remeasure_redoes_them(tmp_path,
                                                              monkeypatch):
    import json

    from benchmarks import run
    measured = []

    def fake_run_one(case, mode, args):
        measured.append((case['variant'], case['edges']))
        status = 'error' if case['variant'] == 'GATConv' and len(measured) < 3 \
            else 'ok'
        return dict(mode=mode, status=status, median_s=1.0, baseline_mib=400.0,
                    peak_mib=410.0, peak_over_baseline_mib=10.0)

    monkeypatch.setattr(run, 'run_one', fake_run_one)
    command = ['--suite', 'scale', '--tiny', '--graphs', 'uniform', '--out',
               str(tmp_path)]
    run.main(command)
    assert len(measured) == 4  # 2 sizes x 2 layers; GATConv failed at 1k
    run.main(command + ['--resume'])  # only the error is measured again
    assert measured[4:] == [('GATConv', 1_000)]
    run.main(command + ['--resume', '--edges', '2000', '--remeasure'])
    assert measured[5:] == [('GATConv', 2_000), ('metric-fused', 2_000)]
    run.main(command + ['--resume', '--remeasure', 'metric-fused'])
    assert measured[7:] == [('metric-fused', 1_000), ('metric-fused', 2_000)]
    data = json.loads((tmp_path / 'scale.json').read_text())
    assert [r['status'] for r in data['results']] == ['ok'] * 4
    # Each cell names the code it measured.
    assert {r['commit'] for r in data['results']} == {data['meta']['commit']}
    assert data['meta']['commit'] not in ('', 'unknown')
    assert len(data['meta']['earlier_runs']) == 3


def test_scale_plan_predicts_and_skips():
    from benchmarks.scale import plan
    done = [scale_result('GATConv', 2_000_000, step_mib=3200.0),
            scale_result('metric-fused', 2_000_000, step_mib=1300.0)]
    big = scale_result('GATConv', 20_000_000)['case']
    cell = plan(big, done, cap_gib=14.0, timeout_s=900.0, skip_over_cap=3.0)
    # 10x the step memory, plus 18M x 16 B of edges and 900k x 256 B of
    # features more than at 2M edges.
    assert cell['skip'] is None
    assert abs(cell['predicted_mib'] - (400 + 32000 + 274.7 + 219.7)) < 1
    assert cell['basis'] == '1678 B/edge at 2M edges'
    assert plan(big, done, 14.0, 900.0, 2.0)['skip'].startswith('predicted 32 GiB')
    # Out of memory at 20M edges: 50M is not tried under the same cap ...
    done.append(scale_result('GATConv', 20_000_000, status='OOM'))
    huge = scale_result('GATConv', 50_000_000)['case']
    assert plan(huge, done, 14.0, 900.0, 3.0)['skip'] == (
        'OOM at 20M edges (over the 14 GiB cap)')
    # ... but is under a larger one (predicted from 2M: 80 GiB, under 5 x
    # 20); other layers and graphs are unaffected.
    assert plan(huge, done, 20.0, 900.0, 5.0)['skip'] is None
    metric = scale_result('metric-fused', 50_000_000)['case']
    assert plan(metric, done, 14.0, 900.0, 3.0)['skip'] is None
    power_law = scale_result('GATConv', 50_000_000, graph='power-law')['case']
    assert plan(power_law, done, 14.0, 900.0, 3.0) == dict(
        skip=None, predicted_mib=None, basis='')


def test_scale_report_states_the_goals_and_plots(tmp_path):
    from benchmarks.scale import goals, plot, report
    results = []
    for graph in ('uniform', 'power-law'):
        results += [
            scale_result('GATConv', 2_000_000, graph=graph, step_mib=3200.0,
                         seconds=14.0),
            scale_result('metric-fused', 2_000_000, graph=graph,
                         step_mib=1300.0, seconds=9.0),
            scale_result('GATConv', 20_000_000, graph=graph, status='OOM',
                         predicted_mib=32768.0,
                         prediction_basis='1678 B/edge at 2M edges'),
            scale_result('metric-fused', 20_000_000, graph=graph,
                         step_mib=13000.0, seconds=100.0),
            scale_result('GATConv', 50_000_000, graph=graph, status='skipped',
                         error='OOM at 20M edges (over the 14 GiB cap)'),
            scale_result('metric-fused', 50_000_000, graph=graph,
                         step_mib=13000.0, seconds=300.0 if graph == 'uniform'
                         else 200.0)]
    rows = {goal: (measured, met) for goal, measured, met in goals(results)}
    trains = rows['uniform 20M: metric-fused trains full batch, GATConv cannot '
                  'or needs >= 5x the memory']
    assert trains[1] and trains[0].endswith(
        'GATConv: OOM (> 14 GiB cap), predicted 32.0 GiB (1678 B/edge at 2M '
        'edges: 2.4x)')
    # 300 s / 50M against 9 s / 2M: 1.33x per edge; 200 s: 0.89x.
    assert rows['uniform metric-fused: wall ns/edge at 50M within 1.5x of '
                '2M'] == ('1.33x', True)
    assert rows['uniform metric-fused: CPU ns/edge at 50M within 1.5x of '
                '2M'] == ('1.33x', True)
    # Where 50M did not run, the goal is not met; 20M / 2M is shown.
    results[-1] = scale_result('metric-fused', 50_000_000, graph='power-law',
                               status='OOM')
    rows = {goal: (measured, met) for goal, measured, met in goals(results)}
    assert rows['power-law metric-fused: CPU ns/edge at 50M within 1.5x of '
                '2M'] == ('50M: OOM (> 14 GiB cap); 20M / 2M: 1.11x', False)
    meta = dict(machine='m', torch='t', torch_geometric='g', threads=2,
                memory_gib=14.0, timeout=900.0, command='c', date='d',
                wall_min=1.0)
    text = report(results, meta)
    assert '| uniform | 1M / 20M | GATConv | OOM (> 14 GiB cap) |' in text
    assert '| uniform | metric-fused | 682 | 682 | 273 | 0.40x | 0.40x |' in text
    plot(results, tmp_path / 'scale.png', 14.0)
    assert (tmp_path / 'scale.png').stat().st_size > 10_000


def test_peak_memory_is_reset_after_the_inputs():
    import resource

    import torch

    from benchmarks.measure import current_rss_mib, reset_peak_rss
    big = torch.ones(2**27)  # 512 MiB
    del big
    assert reset_peak_rss()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert peak < current_rss_mib() + 256


def test_scale_graphs_are_int64_in_range_and_seeded():
    import torch

    from benchmarks.cases import TwoLayerNet
    from benchmarks.graphs import make_graph
    for kind in ('uniform', 'power-law'):
        edge_index = make_graph(kind, 300, 5_000, torch.device('cpu'))
        assert edge_index.dtype == torch.long and edge_index.shape == (2, 5_000)
        assert 0 <= int(edge_index.min()) and int(edge_index.max()) < 300
        assert torch.equal(edge_index,
                           make_graph(kind, 300, 5_000, torch.device('cpu')))
    model = TwoLayerNet('metric-fused', 8, 4)
    assert model(torch.randn(300, 8), edge_index).shape == (300, 8)


def test_a_failed_allocation_under_the_cap_is_out_of_memory():
    # Under RLIMIT_AS torch's CPU allocator can fail with std::bad_alloc
    # (seen at 20M edges), a RuntimeError that names no memory.
    from benchmarks.measure import is_out_of_memory, reads_out_of_memory
    assert is_out_of_memory(RuntimeError('std::bad_alloc'))
    assert reads_out_of_memory('RuntimeError: std::bad_alloc')
    assert reads_out_of_memory('MemoryError')
    assert not reads_out_of_memory('RuntimeError: memory format mismatch')


def test_global_keys_times_both_ways_on_the_same_steps(tmp_path):
    from benchmarks import global_keys
    args = global_keys.parse_args(['--processed-dir', str(tmp_path),
                                   '--meshes', '1', '--repeats', '1',
                                   '--no-progress'])
    result = global_keys.measure(args, synthetic_train=2, synthetic_test=1,
                                 k=16, augment_perturbations='jitter')
    assert set(result['median_ms_per_step']) == {'sampled', 'ranks'}
    # Reading the keys spares the sampling loop's ops (the losses of both
    # ways were checked equal to the bit).
    ops = result['ops_per_step']
    assert ops['ranks'] < ops['sampled'] - 100
    assert '| ranks |' in global_keys.report(result)


def test_no_two_benchmark_modules_import_each_other():
    """The suites share their helpers through benchmarks/shared.py: no
    benchmark module imports one that imports it back (at any depth of
    the code: a function's own import counts too)."""
    import ast
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / 'benchmarks'
    imports = {}
    for path in folder.glob('*.py'):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                if node.module == 'benchmarks':
                    names.update(f'benchmarks.{a.name}' for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
        imports[f'benchmarks.{path.stem}'] = names
    pairs = sorted((a, b) for a, names in imports.items() for b in names
                   if a < b and a in imports.get(b, ()))
    assert not pairs


def test_both_suites_take_the_shared_options():
    from benchmarks import gpu_cases, run
    from benchmarks.shared import size_of

    gpu = gpu_cases.parse_args(['--quick', '--variants', 'GATConv',
                                '--resume', '--timeout', '7', '--device', 'cpu'])
    assert (size_of(gpu), gpu.variants, gpu.resume, gpu.timeout, gpu.device) \
        == ('quick', ['GATConv'], True, 7.0, 'cpu')
    assert gpu_cases.parse_args([]).timeout == 300.0
    # The CPU suites' parser is built in run.main: read it back from --help.
    text = io.StringIO()
    with contextlib.redirect_stdout(text), pytest.raises(SystemExit):
        run.main(['--help'])
    for option in ('--quick', '--tiny', '--variants', '--resume', '--timeout',
                   '--device', '--out'):
        assert option in text.getvalue()
