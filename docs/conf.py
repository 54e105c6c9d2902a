"""Sphinx configuration of the API reference (``make docs``)."""
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import pyg_metric_attn  # noqa: E402

project = 'pyg-metric-attn'
author = 'the pyg-metric-attn authors'
copyright = f'2026, {author}'
release = version = pyg_metric_attn.__version__

extensions = [
    'sphinx.ext.autodoc',
    'sphinx.ext.autosummary',
    'sphinx.ext.napoleon',  # PyG's Google-style "Args:" sections
    'sphinx.ext.mathjax',
    'sphinx.ext.viewcode',
    # MathJax from the package's own copy, not from a CDN: the formulas
    # render without a network (tests/test_docs.py checks the built pages).
    'sphinx-mathjax-offline',  # (its module's name, hyphens and all)
]
# Only the optional packages that this environment lacks are mocked, so that
# the pages of modules that need them still build.
autodoc_mock_imports = [name for name in ('triton', 'torch_scatter',
                                          'torch_sparse')
                        if importlib.util.find_spec(name) is None]
autodoc_default_options = {'members': True, 'member-order': 'bysource',
                           'show-inheritance': True}
autodoc_typehints = 'none'  # the Args sections give the types, as in PyG
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_custom_sections = ['Shapes']  # PyG's shapes: a bullet list, kept
# Only the .rst files are pages: the figures' sources and the raw results
# beside them (docs/design/*.dot, docs/results/**) are not read.
exclude_patterns = ['_build']
html_theme = 'alabaster'
# Wide enough for the results' tables.
html_theme_options = {'page_width': '1180px', 'sidebar_width': '240px'}
html_static_path = []
# Every cross-reference must resolve (a broken one fails `make docs`), except
# those into other projects: their inventories would need the network.
nitpicky = True
nitpick_ignore_regex = [(r'py:.*', r'(?!pyg_metric_attn\b).*')]
# A private base class (shown by show-inheritance).
nitpick_ignore = [('py:class', 'pyg_metric_attn.nn.models.transformer._Sublayers')]
