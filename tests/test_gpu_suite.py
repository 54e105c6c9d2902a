"""The GPU benchmark suite at tiny sizes on the CPU: the jobs, a measured job
in a fresh process, the budget, the graphs and the report (no timing is
asserted). The triton variant runs in Triton's interpreter (conftest.py)."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_cases
from benchmarks.graphs import power_law_edge_index
from benchmarks.op_count import autograd_nodes
from benchmarks.run import main as run_main


def test_a_tiny_run_writes_results_and_tables(tmp_path):
    run_main(['--suite', 'gpu', '--device', 'cpu', '--tiny', '--out',
              str(tmp_path), '--min-time', '0', '--only',
              'sparse uniform 60/400 float32', '--variants', 'GATConv',
              'metric-scatter', '--multi30k', 'off'])
    results = json.loads((tmp_path / 'gpu-tiny.json').read_text())['results']
    assert {(r['case']['variant'], r['mode']) for r in results} == {
        (v, m) for v in ('GATConv', 'metric-scatter') for m in gpu_cases.MODES}
    assert all(r['status'] == 'ok' and len(r['times_s']) >= 3 for r in results)
    table = (tmp_path / 'gpu-tiny.md').read_text()
    assert '| uniform 60/400 float32 | forward_backward |' in table


def test_sdpa_kernel_check_names_the_cpu_kernels():
    report = gpu_cases.sdpa_kernels(torch.device('cpu'), length=16, batch=2,
                                    heads=2, head_dim=8)
    variants = report['variants']
    assert set(variants) == {'sdpa-dot', 'metric-sdpa', 'metric-sdpa-fast',
                             'mha-dot', 'mha-metric', 'mha-metric-fast'}
    # On a CPU the fused CPU kernel runs (never the math fallback).
    assert {v['kernel'] for v in variants.values()} == {'flash'}
    assert any('flash_attention_for_cpu' in name
               for name in variants['metric-sdpa']['names'])
    assert report['metric_sdpa_fused']
    result = dict(case=dict(kind='sdpa-kernels', variant='profile'),
                  mode='forward_backward', status='ok', kernels=report)
    table = gpu_cases.report(dict(size='tiny', device='cpu', command='c',
                                  machine='m', torch='t', cuda=None,
                                  torch_geometric='g', triton='x',
                                  torch_scatter='s', torch_sparse='p',
                                  date='d', budget_s=1), [result])
    assert '| metric-SDPA SDPA kernel (fwd+bwd, bfloat16) | flash |' in table


def test_an_exhausted_budget_skips_and_resume_keeps_results(tmp_path):
    job = gpu_cases.jobs('tiny', gpu_cases.parse_args(
        ['--tiny', '--multi30k', 'off']))[1]
    args = gpu_cases.parse_args(['--device', 'cpu', '--tiny'])
    skipped = gpu_cases.run_job(job, args, deadline=0.0, log_dir=tmp_path)
    assert {r['status'] for r in skipped} == {'skipped'}
    done = {gpu_cases.result_key(r['case'], r['mode']): r | dict(status='ok')
            for r in skipped}
    kept = gpu_cases.run_job(job, args, deadline=0.0, log_dir=tmp_path,
                             previous=done)
    assert {r['status'] for r in kept} == {'ok'}


def test_resume_with_other_jobs_selected_keeps_the_earlier_results(tmp_path):
    # A lease measures some jobs, a later call resumes with --only other
    # jobs: the file (and its tables) must still hold the first call's.
    jobs = gpu_cases.jobs('tiny', gpu_cases.parse_args(
        ['--tiny', '--multi30k', 'off']))
    earlier_job, later_job = jobs[1], jobs[2]
    earlier = [dict(case=case, mode=mode, status='ok', median_s=1e-3,
                    times_s=[1e-3] * 3)
               for case in earlier_job['cases']
               for mode in gpu_cases.case_modes(case)]
    meta = dict(date='2026-11-27', wall_s=1.0)
    (tmp_path / 'gpu-tiny.json').write_text(json.dumps(
        dict(meta=meta, results=earlier)))
    run_main(['--suite', 'gpu', '--device', 'cpu', '--tiny', '--out',
              str(tmp_path), '--resume', '--budget-s', '0', '--only',
              later_job['name'], '--multi30k', 'off'])
    results = json.loads((tmp_path / 'gpu-tiny.json').read_text())['results']
    kept = [r for r in results if r['status'] == 'ok']
    assert kept == earlier
    assert len(results) == len(earlier) + sum(
        len(gpu_cases.case_modes(c)) for c in later_job['cases'])


def test_the_full_plan_runs_the_targets_first():
    names = [job['name'] for job in gpu_cases.jobs(
        'full', gpu_cases.parse_args(['--multi30k', 'synthetic']))]
    assert names[:7] == ['sdpa-kernels L=4096', 'dense-kernel L=4096 bfloat16',
                         'sparse small 2708/10556 float32',
                         'sparse small 19717/88648 float32',
                         'sparse small 169343/1166243 float32',
                         'sparse uniform 100k/2M float32',
                         'sparse uniform 1M/20M float32']
    assert names[-1] == 'multi30k base 300 steps'
    assert len(names) == len(set(names)) == 19


def test_small_sizes_compile_at_cora_and_pubmed_size_only():
    jobs = {job['name']: job for job in gpu_cases.jobs(
        'full', gpu_cases.parse_args(['--multi30k', 'off']))}
    variants = {name: [case['variant'] for case in job['cases']]
                for name, job in jobs.items() if 'small' in name}
    compiled = list(gpu_cases.SMALL_COMPILED_VARIANTS)
    assert variants['sparse small 2708/10556 float32'][-2:] == compiled
    assert variants['sparse small 19717/88648 float32'][-2:] == compiled
    assert not set(compiled) & set(
        variants['sparse small 169343/1166243 float32'])
    case = jobs['sparse small 2708/10556 float32']['cases'][-1]
    assert gpu_cases.case_modes(case) == ('forward_backward',)
    assert gpu_cases.warmup_steps(case) == 3
    assert case['out_channels'] == 16  # 64 -> 4 heads x 16 (issue 26)


SESSION = Path(__file__).resolve().parents[1] / 'benchmarks' / 'gpu_session.sh'


def session_array(name: str) -> list[str]:
    """A bash array of benchmarks/gpu_session.sh, as its words."""
    text = re.search(rf'^{name}=\((.*?)\)$', SESSION.read_text(),
                     re.MULTILINE | re.DOTALL).group(1)
    return shlex.split(text)


def run_session(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, DEVICE='cpu', PYTHON=sys.executable,
               OUT=str(tmp_path))
    return subprocess.run(['bash', str(SESSION), *args], capture_output=True,
                          text=True, env=env, timeout=300)


ISSUE_60_TABLE = {
    'sparse small 2708/10556 float32': {'GATConv', 'metric-triton',
                                        'GATConv-compiled',
                                        'metric-triton-compiled'},
    'sparse small 19717/88648 float32': {'GATConv', 'metric-triton',
                                         'GATConv-compiled',
                                         'metric-triton-compiled'},
    **{f'sparse {graph} 100k/2M {dtype}': {'GATConv', 'metric-triton'}
       for graph in ('uniform', 'power-law') for dtype in ('float32', 'bfloat16')},
    **{f'dense-kernel L={length} bfloat16': {'sdpa-dot', 'metric-sdpa',
                                             'metric-sdpa-fast'}
       for length in (1024, 4096, 16384)},
    **{f'dense-module L={length} bfloat16': {'mha-dot', 'mha-metric',
                                             'mha-metric-fast'}
       for length in (1024, 4096, 16384)},
    'sdpa-kernels L=4096': {'profile'},
}


def test_the_session_table_is_issue_60s():
    """The jobs and variants the session's lease and table calls measure:
    every row of issue 60's table (the small graphs eager and compiled with
    fullgraph, 100k / 2M in both dtypes and both degree laws, the dense
    kernel and module at three lengths), nothing else."""
    jobs = gpu_cases.jobs('full', gpu_cases.parse_args(session_array('TABLE')))
    selected = {job['name']: {case['variant'] for case in job['cases']}
                for job in jobs}
    assert selected == ISSUE_60_TABLE
    compiled = next(case for job in jobs for case in job['cases']
                    if case['variant'] == 'metric-triton-compiled')
    assert gpu_cases.case_modes(compiled) == ('forward_backward',)
    assert 'fullgraph=True' in gpu_cases.compiled_forward.__doc__


def test_the_session_plans_the_table_and_names_its_modes(tmp_path):
    """``gpu_session.sh plan`` is the table's dry run (on a CPU too); an
    unknown mode is a usage error; every device test file exists."""
    done = run_session('plan', tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ISSUE_60_TABLE:
        assert name in done.stdout
    assert 'estimated in all' in done.stdout
    wrong = run_session('nope', tmp_path=tmp_path)
    assert wrong.returncode == 2 and 'lease|table|plan' in wrong.stderr
    root = SESSION.parents[1]
    assert all((root / path).is_file() for path in session_array('DEVICE_TESTS'))


def test_power_law_graph_has_hubs_and_is_deterministic():
    edge_index = power_law_edge_index(2000, 40_000, torch.device('cpu'))
    assert edge_index.shape == (2, 40_000)
    assert 0 <= int(edge_index.min()) and int(edge_index.max()) < 2000
    in_degree = torch.bincount(edge_index[1], minlength=2000)
    assert int(in_degree.max()) > 20 * 40_000 / 2000  # hubs ...
    assert int((in_degree == 0).sum()) > 0  # ... and leaves without edges
    assert torch.equal(edge_index, power_law_edge_index(
        2000, 40_000, torch.device('cpu')))


def test_triton_variant_step_matches_the_scatter_variant(monkeypatch, device):
    """The metric-triton step's output and parameter gradients equal the
    metric-scatter step's (same seed, so same weights and graph)."""
    pytest.importorskip('triton')
    layers, sparse_layer = [], gpu_cases.sparse_layer

    def recorded_layer(*args):
        layer = sparse_layer(*args)
        layer.register_forward_hook(
            lambda module, inputs, output: setattr(module, 'output', output))
        layers.append(layer)
        return layer

    monkeypatch.setattr(gpu_cases, 'sparse_layer', recorded_layer)
    for variant in ('metric-triton', 'metric-scatter'):
        case = dict(kind='sparse', variant=variant, graph='power-law',
                    nodes=12, edges=40, dtype='float32', heads=2, channels=4)
        gpu_cases.build_step(case, 'forward_backward', gpu_cases.Job(device))()
    triton, scatter = layers
    # The kernels' autograd node (eager: function.TritonAttention).
    assert 'TritonAttentionBackward' in autograd_nodes(triton.output)
    assert 'TritonAttentionBackward' not in autograd_nodes(scatter.output)
    torch.testing.assert_close(triton.output, scatter.output)
    gradients = {name: p.grad for name, p in triton.named_parameters()}
    assert gradients and all(g is not None for g in gradients.values())
    for name, p in scatter.named_parameters():
        torch.testing.assert_close(gradients[name], p.grad, msg=name)


def test_targets_report_met_missed_and_oom():
    def result(variant, mode, status='ok', seconds=1.0, memory=100.0, **case):
        return dict(case=dict(variant=variant, **case), mode=mode,
                    status=status, median_s=seconds,
                    peak_over_baseline_mib=memory)

    sparse = dict(kind='sparse', graph='uniform', dtype='float32')
    cora = dict(nodes=2_708, edges=10_556)
    small, big = dict(nodes=100_000, edges=2_000_000), dict(
        nodes=1_000_000, edges=20_000_000)
    dense = dict(kind='dense-kernel', length=4096)
    results = [
        result('GATConv', 'forward_backward', seconds=1.0, **sparse, **cora),
        result('metric-triton', 'forward_backward', seconds=0.9, **sparse,
               **cora),
        result('GATConv-compiled', 'forward_backward', seconds=1.0, **sparse,
               **cora),
        result('metric-triton-compiled', 'forward_backward', seconds=1.2,
               **sparse, **cora),
        result('GATConv', 'forward_backward', seconds=1.0, memory=1000, **sparse,
               **small),
        result('metric-triton', 'forward_backward', seconds=0.15, memory=300,
               **sparse, **small) | dict(gpu_busy_share=0.85),
        result('GATConv', 'forward_backward', status='OOM', **sparse, **big),
        result('metric-triton', 'forward_backward', **sparse, **big),
        result('sdpa-dot', 'forward', seconds=1.0, **dense),
        result('metric-sdpa', 'forward', seconds=1.05, **dense)]
    rows = {row[0]: row for row in gpu_cases.targets(results, 'full')}
    assert rows['metric-triton / GATConv time, 2708/10556 float32 fwd+bwd, '
                'eager'][1:] == ('0.900', '<= 1.0', True)
    assert not rows['metric-triton / GATConv time, 2708/10556 float32 '
                    'fwd+bwd, reduce-overhead'][3]
    assert rows['metric-triton / GATConv time, 100k/2M float32 fwd+bwd'][3]
    assert not rows['metric-triton / GATConv peak memory, 100k/2M float32 '
                    'fwd+bwd'][3]
    assert rows['metric-triton GPU busy share, 100k/2M float32 fwd+bwd'][1:] \
        == ('0.85', '>= 0.8', True)
    assert rows['GATConv / metric-triton peak memory, 1M/20M float32 '
                'fwd+bwd'][1:] == ('GATConv OOM, metric-triton ran', '>= 5.0',
                                   True)
    assert rows['metric-sdpa / sdpa-dot time, L=4096 bfloat16 forward'][3]
    assert not rows['metric-sdpa / sdpa-dot time, L=1024 bfloat16 forward'][3]
    assert rows['metric-sdpa / sdpa-dot time, L=4096 bfloat16 '
                'forward_backward'][1].startswith('not measured')


def test_cudagraph_fallbacks_are_counted_and_reported():
    from torch._dynamo.utils import counters

    before = gpu_cases.cudagraph_skips()
    counters['inductor']['cudagraph_skips'] += 2  # what Inductor does on one
    assert gpu_cases.cudagraph_skips() - before == 2
    counters['inductor']['cudagraph_skips'] -= 2
    meta = dict(size='full', device='cuda', command='c', machine='m', torch='t',
                cuda='13', torch_geometric='g', triton='x', torch_scatter='s',
                torch_sparse='p', date='d', budget_s=1)
    case = dict(kind='sparse', graph='uniform', nodes=2_708, edges=10_556,
                dtype='float32', heads=4, channels=64, out_channels=16)
    results = [dict(case=case | dict(variant=variant), mode='forward_backward',
                    status='ok', median_s=2e-3, peak_over_baseline_mib=1.0,
                    cudagraph_skips=skips)
               for variant, skips in (('GATConv-compiled', 0),
                                      ('metric-triton-compiled', 2))]
    table = gpu_cases.report(meta, results)
    assert '| uniform 2708/10556 float32 | GATConv-compiled | 0 |' in table
    assert '| uniform 2708/10556 float32 | metric-triton-compiled | 2 |' in table


def test_every_job_of_the_suite_runs_at_tiny_size(device):
    """Each (case, mode) of every job of ``--suite gpu --tiny`` (the
    Multi30k speed job on synthetic ids included) measured in this process,
    then the report: a job that crashes fails here (on the CPU, in CI)
    before it costs GPU time. On a CPU the eager Triton variant (seconds
    per step in the interpreter) is left to
    test_triton_variant_step_matches_the_scatter_variant; on a GPU the
    compiled variants (CUDA graphs, tens of seconds of compiling) are left
    to the suite's run."""
    args = gpu_cases.parse_args(['--tiny', '--device', device.type,
                                 '--multi30k', 'synthetic'])
    results, kinds = [], set()
    for job in gpu_cases.jobs('tiny', args):
        shared = gpu_cases.Job(device)
        for case in job['cases']:
            if case['variant'] == 'metric-triton' and device.type == 'cpu':
                continue
            if gpu_cases.is_compiled(case) and device.type == 'cuda':
                continue  # compiles for minutes; the suite's own run times it
            kinds.add(case['kind'])
            for mode in gpu_cases.case_modes(case):
                if case['kind'] == 'sdpa-kernels':
                    result = dict(status='ok', kernels=gpu_cases.sdpa_kernels(
                        device, getattr(torch, case['dtype']), case['length'],
                        case['batch'], case['heads'], case['head_dim']))
                elif case['kind'] == 'multi30k':
                    result = gpu_cases.multi30k_speed(case, device, float('inf'))
                else:
                    step = gpu_cases.build_step(case, mode, shared)
                    result = gpu_cases.measure(step, device, 0.0, float('inf'),
                                               gpu_cases.warmup_steps(case))
                assert result['status'] == 'ok', (job['name'], case, mode)
                results.append(dict(case=case, mode=mode, job=job['name'],
                                    **result))
    assert kinds == {'sdpa-kernels', 'dense-kernel', 'dense-module', 'sparse',
                     'multi30k'}
    table = gpu_cases.report(dict(size='tiny', device='cpu', command='c',
                                  machine='m', torch='t', cuda=None,
                                  torch_geometric='g', triton='x',
                                  torch_scatter='s', torch_sparse='p',
                                  date='d', budget_s=1), results)
    assert '### Multi30k `base` preset training speed' in table


def test_the_host_profile_reports_a_step(capsys, device):
    """``benchmarks.host_profile`` (run in a lease before the suite) on a
    tiny GATConv step: the summary line and both tables."""
    from benchmarks import host_profile
    host_profile.main(['--variant', 'GATConv', '--nodes', '30', '--edges',
                       '120', '--steps', '2', '--top', '3', '--device',
                       device.type])
    out = capsys.readouterr().out
    assert 'median step:' in out and 'launches per step' in out
    assert 'host functions by own time' in out and 'Self CPU' in out


def test_a_compiled_cell_prepares_its_graph_eagerly_first():
    """The compiled cells call the layer once eagerly before compiling, as a
    training loop on a fixed graph does, so the compiled step reads the
    cached graph instead of building it in the graph (issue 60)."""
    from pyg_metric_attn.utils import graph_cache
    graph_cache.clear()
    x = torch.randn(12, 8)
    edge_index = torch.randint(0, 12, (2, 30))
    layer = gpu_cases.sparse_layer('metric-triton', 8, 4, 2)
    gpu_cases.compiled_forward(layer, x, edge_index)
    kinds = {key[1][0] for key in graph_cache._entries
             if key[0] == id(edge_index)}
    assert 'triton_graph' in kinds
