"""The documentation works offline and its diagrams are up to date: no built
page loads a script or stylesheet from the network (``make docs`` runs the
same check on the tree it builds), and every diagram of the design page was
drawn from its current source."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


check_offline = load(ROOT / 'docs' / 'check_offline.py')
render = load(ROOT / 'docs' / 'design' / 'render.py')

#: What Sphinx writes with ``sphinx.ext.mathjax`` alone (MathJax from a CDN).
CDN_PAGE = """<html><head>
<link rel="stylesheet" type="text/css" href="_static/alabaster.css?v=1" />
<script src="_static/documentation_options.js?v=5929fcd5"></script>
<script async="async" src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"></script>
</head><body><a href="https://pyg.org">PyG</a>
<img src="_images/curves.png" alt="curves"/></body></html>"""


def test_remote_loads_finds_remote_scripts_and_stylesheets_only():
    assert check_offline.remote_loads(CDN_PAGE) == [
        'https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js']
    page = ('<link rel="stylesheet" href="//fonts.example.org/a.css">'
            '<link rel="canonical" href="https://example.org/">'
            "<script src='_static/mathjax/tex-chtml.js'></script>"
            '<img src="http://example.org/a.png">')
    assert check_offline.remote_loads(page) == ['//fonts.example.org/a.css',
                                                'http://example.org/a.png']


def test_check_tree_fails_on_a_page_with_a_cdn_script(tmp_path, capsys):
    (tmp_path / 'index.html').write_text(CDN_PAGE.replace('https://cdn', 'x'))
    assert check_offline.main([str(tmp_path)]) == 0
    (tmp_path / 'api').mkdir()
    (tmp_path / 'api' / 'nn.html').write_text(CDN_PAGE)
    assert check_offline.main([str(tmp_path)]) == 1
    assert 'api/nn.html: loads https://cdn.jsdelivr.net' in capsys.readouterr().err


def test_the_docs_take_mathjax_from_the_package():
    """``docs/conf.py`` loads the offline MathJax extension (without it
    ``sphinx.ext.mathjax`` points every page with a formula at a CDN)."""
    conf = (ROOT / 'docs' / 'conf.py').read_text()
    assert "'sphinx-mathjax-offline'" in conf
    assert 'mathjax_path' not in conf


@pytest.mark.skipif(not (ROOT / 'docs' / '_build' / 'html' / 'index.html').exists(),
                    reason='docs not built here (make docs checks what it builds)')
def test_the_built_docs_load_nothing_remote():
    assert check_offline.check_tree(ROOT / 'docs' / '_build' / 'html') == {}


def test_every_design_diagram_matches_its_source(tmp_path):
    assert sorted(path.name for path in (ROOT / 'docs' / 'design').glob('*.dot'))
    assert render.stale() == []
    # A changed source is caught without Graphviz.
    for source in (ROOT / 'docs' / 'design').glob('*'):
        if source.suffix in ('.dot', '.svg'):
            (tmp_path / source.name).write_bytes(source.read_bytes())
    edited = next(tmp_path.glob('*.dot'))
    edited.write_text(edited.read_text() + '\n// edited\n')
    assert render.stale(tmp_path) == [
        f'{edited.stem}.svg was not drawn from the current {edited.name}']
    os.remove(tmp_path / f'{edited.stem}.svg')
    assert render.stale(tmp_path) == [f'{edited.stem}.svg is missing']


def test_the_gpu_figure_reads_the_gpu_pages_ratios(tmp_path):
    """``benchmarks/gpu_figure.py`` takes its ratios from the committed
    ``gpu.json`` files, and they are the ones the GPU page and the README
    quote (metric-triton / GATConv, fwd+bwd, float32; the dense module)."""
    import json

    from benchmarks import gpu_figure

    graphs = [(nodes, edges) for nodes, edges, _ in gpu_figure.GRAPHS]
    quoted = {'gpu-2026-11-27-second': ([1.06, 1.16, 0.46, 0.35, None],
                                        [1.27, 1.12, 0.99]),
              'gpu-2026-11-27': ([1.29, 1.23, 0.46, 0.34, 0.33],
                                 [None, None, None]),
              'gpu-2026-11-26': ([2.00, 1.19, 0.45, 0.33, None],
                                 [1.68, 1.22, 1.02])}
    for name, (sparse, dense) in quoted.items():
        results = json.loads((gpu_figure.RESULTS / name / 'gpu.json').read_text())
        table = gpu_figure.medians(results['results'])
        for measured, expected in (
                (gpu_figure.ratios(table, 'sparse', 'metric-triton', 'GATConv',
                                   graphs, 'float32'), sparse),
                (gpu_figure.ratios(table, 'dense-module', 'mha-metric', 'mha-dot',
                                   list(gpu_figure.LENGTHS), 'bfloat16'), dense)):
            assert [None if value is None else round(value + 1e-9, 2)
                    for value in measured] == expected, name
    out = tmp_path / 'ratios.png'
    gpu_figure.main(['--out', str(out)])
    assert out.stat().st_size > 10_000
