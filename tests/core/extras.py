"""The optional packages of ``pyproject.toml``'s extras by import name, and a
way to hide them from this interpreter (as if not installed)."""
from __future__ import annotations

import importlib.abc
import importlib.util
import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / 'pyproject.toml'
#: Extras that no library module imports from.
TOOLING = ('dev', 'docs')
#: Import names that are not the distribution name with '_' for '-'.
IMPORT_NAMES = {'scikit-image': 'skimage', 'scikit-learn': 'sklearn',
                'pytest-xdist': 'xdist',
                # A module named with hyphens (Sphinx imports it by that name).
                'sphinx-mathjax-offline': 'sphinx-mathjax-offline'}
#: Further top-level modules that a distribution of an extra installs.
ALSO_INSTALLED = {'matplotlib': ('mpl_toolkits',)}


def requirement_name(requirement: str) -> str:
    return re.match(r'[A-Za-z0-9_.-]+', requirement).group(0).lower()


def import_name(distribution: str) -> str:
    return IMPORT_NAMES.get(distribution, distribution.replace('-', '_'))


def project() -> dict:
    import tomllib  # Python >= 3.11
    return tomllib.loads(PYPROJECT.read_text())['project']


def extra_modules() -> dict[str, set[str]]:
    """``{extra: import names of its packages}`` (other extras it includes
    and the tooling extras left out)."""
    info = project()
    return {extra: {import_name(requirement_name(r)) for r in requirements
                    if requirement_name(r) != info['name']}
            for extra, requirements in info['optional-dependencies'].items()
            if extra not in TOOLING}


def hidden_modules() -> set[str]:
    names = set().union(*extra_modules().values())
    return names.union(*(ALSO_INSTALLED.get(n, ()) for n in names))


class HideExtras(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the optional packages first and fails to load them, as an
    import of a package that is not installed fails."""
    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in self.names:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        raise ModuleNotFoundError(f'No module named {spec.name!r}',
                                  name=spec.name)

    def exec_module(self, module):  # never reached
        raise AssertionError(module)


def hide() -> None:
    """Hide the optional packages from this interpreter; call it before
    anything imports torch_geometric (which looks for torch_scatter)."""
    sys.meta_path.insert(0, HideExtras(hidden_modules()))
