"""The core install: pyproject's dependencies are the core alone, and the core
tests (``tests/core``) pass with every extra hidden, as in a venv that has
only the core (``make test-core`` runs them in a real one)."""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tests' / 'core'))
from extras import (  # noqa: E402
    extra_modules,
    import_name,
    project,
    requirement_name,
)

pytest.importorskip('tomllib')


def test_pyproject_core_and_extras():
    info = project()
    assert {requirement_name(r) for r in info['dependencies']} == {
        'torch', 'torch-geometric', 'numpy', 'scipy', 'tqdm'}
    extras = info['optional-dependencies']
    assert {'mesh', 'experiments', 'gpu', 'sampling', 'dev'} <= set(extras)
    # The experiments' human_seg task needs the mesh extra.
    assert f"{info['name']}[mesh]" in extras['experiments']
    assert 'trimesh' in extra_modules()['mesh']


def test_import_names_of_the_installed_extras():
    """The names the core tests hide are the ones the distributions install
    (checked for those installed here)."""
    installs: dict[str, set[str]] = {}
    for module, distributions in importlib.metadata.packages_distributions(
            ).items():
        for distribution in distributions:
            installs.setdefault(distribution.lower().replace('_', '-'),
                                set()).add(module)
    checked = 0
    for requirements in project()['optional-dependencies'].values():
        for requirement in requirements:
            name = requirement_name(requirement)
            if name in installs:
                assert import_name(name) in installs[name], (name, installs[name])
                checked += 1
    assert checked >= 10


def test_core_tests_pass_with_the_extras_hidden():
    code = textwrap.dedent("""
        import sys
        sys.path.insert(0, 'tests/core')
        import extras
        extras.hide()
        import pytest
        sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-W',
                              'ignore::DeprecationWarning', 'tests/core']))
    """)
    env = dict(os.environ, PYG_METRIC_ATTN_CORE_ONLY='1',
               PYTHONPATH=os.pathsep.join([str(ROOT),
                                           os.environ.get('PYTHONPATH', '')]))
    result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    output = result.stdout[-3000:] + result.stderr[-2000:]
    assert result.returncode == 0, output
    assert ' passed' in result.stdout and 'skipped' not in result.stdout, output
