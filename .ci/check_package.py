"""Build the sdist and the wheel, check what they hold, install the wheel into
a fresh venv with the core dependencies alone (torch first, the pinned CPU
build) and use the package from outside the source tree.

    python .ci/check_package.py [--keep DIR]

Checks: LICENSE in both archives; the sdist holds the wheel's package files,
pyproject.toml and README.md, and no tests; the wheel carries the shipped
human_seg model (weights and card, a few MB); pip would not install a CUDA
torch (no nvidia-* packages); the installed package imports from the venv,
a MetricAttentionConv runs forward and backward, the license is in the
installed metadata, and ``pyg-metric-attn --help`` without the
[experiments] extra says in one line to install it. Then, with the
[experiments] extra added, a mesh is segmented with the shipped model, no
training: ``examples/segment_a_mesh.py`` writes a procedural humanoid and
segments it in Python, ``pyg-metric-attn predict human_seg`` segments the
same file, and both give the same labels.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START = time.perf_counter()
TORCH = 'torch==2.13.0'

USE = r"""
import importlib.metadata, pathlib, sys
import torch
import pyg_metric_attn
from pyg_metric_attn import MetricAttentionConv
source = pathlib.Path(sys.argv[1])
assert source not in pathlib.Path(pyg_metric_attn.__file__).parents, \
    pyg_metric_attn.__file__
conv = MetricAttentionConv(4, 8, heads=2)
x = torch.randn(5, 4, requires_grad=True)
edge_index = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])
conv(x, edge_index).sum().backward()
assert x.grad is not None and bool(torch.isfinite(x.grad).all())
files = importlib.metadata.files('pyg-metric-attn')
assert any(f.name == 'LICENSE' for f in files), files
print(f'pyg_metric_attn from {pyg_metric_attn.__file__}, torch {torch.__version__}')
"""


def run(*args: str | Path, **kwargs) -> subprocess.CompletedProcess:
    shown = ' '.join(str(a).strip().splitlines()[0] for a in args)
    print(f'[{time.perf_counter() - START:4.0f} s] {shown}', flush=True)
    return subprocess.run([str(a) for a in args], check=True, **kwargs)


def check_archives(dist: Path) -> Path:
    """The wheel's path, after checking both archives' contents."""
    (wheel,) = dist.glob('*.whl')
    (sdist,) = dist.glob('*.tar.gz')
    wheel_files = zipfile.ZipFile(wheel).namelist()
    info = next(name.split('/')[0] for name in wheel_files
                if name.split('/')[0].endswith('.dist-info'))
    assert f'{info}/licenses/LICENSE' in wheel_files, wheel_files
    package = {name for name in wheel_files
               if name.startswith('pyg_metric_attn/')}
    assert 'pyg_metric_attn/py.typed' in package
    shipped = {name: zipfile.ZipFile(wheel).getinfo(name).file_size
               for name in ('pyg_metric_attn/pretrained/human_seg.pt',
                            'pyg_metric_attn/pretrained/human_seg.json')}
    assert shipped['pyg_metric_attn/pretrained/human_seg.pt'] < 16 << 20, shipped
    assert set(wheel_files) - package <= {
        name for name in wheel_files if name.startswith(f'{info}/')}, \
        sorted(set(wheel_files) - package)
    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split('/')[0]
        sdist_files = {name.removeprefix(f'{top}/')
                       for name in archive.getnames()}
    assert {'LICENSE', 'pyproject.toml', 'README.md'} <= sdist_files
    assert package <= sdist_files, sorted(package - sdist_files)
    assert not any(name.startswith('tests') for name in sdist_files), \
        'the sdist holds tests'
    print(f'{wheel.name}: {len(package)} package files and LICENSE; '
          f'{sdist.name}: the same, no tests')
    return wheel


def install(venv: Path, wheel: Path) -> Path:
    """The venv's python, with torch and the wheel installed."""
    run(sys.executable, '-m', 'venv', venv)
    python = venv / 'bin' / 'python'
    report = venv / 'torch-report.json'
    run(python, '-m', 'pip', 'install', '--quiet', '--dry-run', '--report',
        report, TORCH)
    planned = [item['metadata']['name'].lower()
               for item in json.loads(report.read_text())['install']]
    cuda = [name for name in planned if name.startswith('nvidia-')]
    if cuda:
        sys.exit(f"error: pip would install a CUDA torch ({', '.join(cuda)}); "
                 f"point pip at the CPU wheel (PIP_FIND_LINKS, or "
                 f"--index-url https://download.pytorch.org/whl/cpu)")
    # No .pyc compilation: it takes most of the time of torch's install.
    run(python, '-m', 'pip', 'install', '--quiet', '--no-compile', TORCH)
    run(python, '-m', 'pip', 'install', '--quiet', '--no-compile', wheel)
    return python


def segment_with_the_shipped_model(python: Path, wheel: Path, work: Path) -> None:
    """With the [experiments] extra: the shipped model segments a mesh it
    never saw, in Python and from the command line, alike."""
    run(python, '-m', 'pip', 'install', '--quiet', '--no-compile',
        f'{wheel}[experiments]')
    run(python, ROOT / 'examples' / 'segment_a_mesh.py', '--out',
        work / 'example', cwd=work)
    mesh = work / 'example' / 'humanoid.obj'
    run(python.parent / 'pyg-metric-attn', 'predict', 'human_seg', mesh,
        '--out', work / 'predicted', cwd=work)
    labels = [(folder / 'humanoid.txt').read_text()
              for folder in (work / 'example', work / 'predicted')]
    assert labels[0] == labels[1] and len(set(labels[0].split())) > 1, labels
    assert (work / 'predicted' / 'humanoid.png').stat().st_size > 0
    print(f"the shipped model segmented {mesh.name}: "
          f"{len(labels[0].split())} faces, {len(set(labels[0].split()))} parts")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--keep', type=Path, help='work in this folder and '
                        'keep it (default: a temporary one, removed)')
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix='check-package-') as temporary:
        work = args.keep or Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        run(sys.executable, '-m', 'build', '--outdir', work / 'dist', ROOT,
            stdout=subprocess.DEVNULL)
        wheel = check_archives(work / 'dist')
        python = install(work / 'venv', wheel)
        run(python, '-c', USE, ROOT, cwd=work)
        cli = subprocess.run([str(python.parent / 'pyg-metric-attn'), '--help'],
                             cwd=work, capture_output=True, text=True)
        assert cli.returncode == 1 and cli.stdout == '', cli
        assert cli.stderr.count('\n') == 1, cli.stderr
        assert "pip install 'pyg-metric-attn[experiments]'" in cli.stderr, \
            cli.stderr
        print(f'core install: {cli.stderr.strip()}')
        segment_with_the_shipped_model(python, wheel, work)
    print(f'check-package passed in {time.perf_counter() - START:.0f} s')


if __name__ == '__main__':
    main()
