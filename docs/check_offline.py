"""Check that no page of a built HTML tree loads anything from the network:
no ``<script src>``, stylesheet or preloaded resource with a remote address
(``http:``, ``https:`` or protocol-relative ``//``).

    python docs/check_offline.py [docs/_build/html]

``make docs`` runs it after Sphinx; ``tests/test_docs.py`` tests it.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

#: An element that makes the browser fetch what its attribute names.
_LOADING = re.compile(
    r'<(script|link|img|iframe|source)\b[^>]*?\b(src|href)\s*=\s*["\']([^"\']*)["\']',
    re.I | re.S)
_REMOTE = re.compile(r'^\s*(https?:)?//', re.I)


def remote_loads(html: str) -> list[str]:
    """The remote addresses an HTML page loads: the ``src`` of scripts,
    images and frames, the ``href`` of stylesheets and preloads (plain links
    to other sites are not loads)."""
    found = []
    for match in _LOADING.finditer(html):
        tag, attribute, address = match[1].lower(), match[2].lower(), match[3]
        if tag == 'link' and not re.search(
                r'\brel\s*=\s*["\'][^"\']*\b(stylesheet|preload|modulepreload|icon)\b',
                match[0], re.I):
            continue
        if attribute == 'href' and tag != 'link':
            continue
        if _REMOTE.match(address):
            found.append(address)
    return found


def check_tree(root: Path) -> dict[str, list[str]]:
    """``{page: remote addresses}`` for every page of ``root`` that loads any."""
    pages = sorted(root.rglob('*.html'))
    if not pages:
        raise FileNotFoundError(f'no HTML pages under {root}')
    problems = {}
    for page in pages:
        found = remote_loads(page.read_text(errors='replace'))
        if found:
            problems[str(page.relative_to(root))] = found
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0] if args else 'docs/_build/html')
    problems = check_tree(root)
    for page, found in problems.items():
        print(f'{page}: loads {", ".join(sorted(set(found)))}', file=sys.stderr)
    if problems:
        print(f'{len(problems)} pages load remote resources', file=sys.stderr)
        return 1
    print(f'{root}: no page loads a remote resource')
    return 0


if __name__ == '__main__':
    sys.exit(main())
