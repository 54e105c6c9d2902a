"""Render the design page's diagrams: every ``docs/design/*.dot`` to an SVG
beside it, with Graphviz's ``dot`` (``apt-get install graphviz``).

    python docs/design/render.py [--check]

The SVGs are committed, so ``make docs`` needs no Graphviz. Each SVG
records the sha256 of the source it was drawn from, and ``--check`` (also
run by ``tests/test_docs.py``, without ``dot``) fails where a source changed
after its rendering.
"""
from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
STAMP = re.compile(r'<!-- source sha256: ([0-9a-f]{64}) -->')


def source_hash(source: Path) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def stale(folder: Path = FOLDER) -> list[str]:
    """The diagrams whose SVG is missing or was drawn from another source."""
    problems = []
    for source in sorted(folder.glob('*.dot')):
        svg = source.with_suffix('.svg')
        if not svg.exists():
            problems.append(f'{svg.name} is missing')
            continue
        stamp = STAMP.search(svg.read_text())
        if stamp is None or stamp[1] != source_hash(source):
            problems.append(f'{svg.name} was not drawn from the current '
                            f'{source.name}')
    return problems


def render(folder: Path = FOLDER) -> list[Path]:
    """Draw every source with ``dot -Tsvg`` and stamp its hash."""
    dot = shutil.which('dot')
    if dot is None:
        raise SystemExit('dot (Graphviz) is not installed: apt-get install graphviz')
    written = []
    for source in sorted(folder.glob('*.dot')):
        svg = subprocess.run([dot, '-Tsvg', str(source)], check=True,
                             capture_output=True, text=True).stdout
        # Graphviz's own comments carry its version; the stamp follows them.
        header, _, body = svg.partition('<svg')
        stamp = f'<!-- source sha256: {source_hash(source)} -->\n'
        target = source.with_suffix('.svg')
        target.write_text(header + stamp + '<svg' + body)
        written.append(target)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--check', action='store_true',
                        help='only check that every SVG matches its source')
    args = parser.parse_args()
    if args.check:
        problems = stale()
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    for path in render():
        print(path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
