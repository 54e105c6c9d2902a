"""Every ``pyg-metric-attn`` and ``make`` command the README shows works as
written: the cheap ones run (at one epoch), the long ones must at least be
accepted by the command line's parser (``make``: a dry run), and every
``-o KEY=VALUE`` it shows is an option of some task. A command added to or
changed in the README is checked the same way, so the README cannot drift
from the code. The commands of the API reference's pages (``docs/``) are
parsed too."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import trimesh

from pyg_metric_attn.cli import build_parser, main
from pyg_metric_attn.experiments import TASKS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / 'README.md').read_text()

#: README commands that run here as written (``--epochs N`` as one epoch),
#: with these flags appended.
RUN = {
    'pyg-metric-attn train moon --attention l2 -o validation=100 --out RUN':
        ['--epochs', '1', '--no-progress'],
    'pyg-metric-attn evaluate moon RUN --split val': [],
    'pyg-metric-attn experiment NAME --attention metric,l2,dot,gat --seeds 10 '
    '[--epochs N] [--out runs/NAME] [-o KEY=VALUE ...]':
        ['--no-progress'],
}


def commands(lines: list[str]) -> list[str]:
    """The ``pyg-metric-attn`` and ``make`` commands among ``lines`` (comments
    dropped, spaces normalised), each once, in order."""
    found = [' '.join(line.split(' #')[0].split()) for line in lines]
    return list(dict.fromkeys(command for command in found
                              if command.startswith(('pyg-metric-attn ',
                                                     'make '))))


def readme_commands() -> list[str]:
    """The commands of the README's code blocks (continuation lines joined)
    and inline code spans."""
    lines = []
    for block in re.findall(r'^```[^\n]*\n(.*?)^```', README, re.M | re.S):
        lines += block.replace('\\\n', ' ').splitlines()
    prose = re.sub(r'^```.*?^```', '', README, flags=re.M | re.S)
    return commands(lines + re.findall(r'(?<!`)`([^`]+)`(?!`)', prose))


def docs_commands() -> list[str]:
    """The commands of the indented (code) blocks of ``docs/**/*.rst``
    (continuation lines joined)."""
    lines = []
    for page in sorted((ROOT / 'docs').rglob('*.rst')):
        text = page.read_text().replace('\\\n', ' ')
        lines += [line for line in text.splitlines() if line.startswith('    ')]
    return commands(lines)


def check_parses(command: str, values: dict[str, str], capsys) -> None:
    """``make``: a dry run succeeds; ``pyg-metric-attn``: the parser accepts
    the arguments."""
    args = argv(command, values)
    if command.startswith('make '):
        result = subprocess.run(['make', '-n', '-C', str(ROOT), *args],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, (command, result.stderr)
        return
    try:
        build_parser().parse_args(args)
    except SystemExit as error:
        pytest.fail(f'{command!r}: {capsys.readouterr().err} ({error})')


def argv(command: str, values: dict[str, str]) -> list[str]:
    """The arguments of a README command: ``[optional]`` parts included, the
    placeholders in capitals replaced by ``values``, the first of ``a|b``,
    ``...`` dropped."""
    command = re.sub(r'\[([^\]]*)\]', r'\1', command)
    command = re.sub(r'\b[A-Z][A-Z=]*\b',
                     lambda match: values.get(match[0], match[0]), command)
    return [word.split('|')[0] for word in command.split()[1:]
            if word != '...']


@pytest.fixture
def values(tmp_path, monkeypatch) -> dict[str, str]:
    """Placeholders' values, in an empty working directory."""
    monkeypatch.chdir(tmp_path)
    mesh = trimesh.creation.icosphere(subdivisions=1)
    mesh.export(tmp_path / 'mesh.obj')
    mesh.export(tmp_path / 'more.ply')
    return {'NAME': 'moon', 'N': '1', 'S': '0', 'RUN': str(tmp_path / 'run'),
            'ROOT': str(tmp_path), 'DIR': str(tmp_path / 'dir'),
            'KEY=VALUE': 'lr=0.01'}


def test_the_readme_shows_the_commands_that_run_here():
    commands = readme_commands()
    assert len(commands) >= 15, commands
    assert set(RUN) <= set(commands), sorted(set(RUN) - set(commands))


@pytest.mark.usefixtures('one_thread')
def test_every_readme_command_runs_or_parses(values, capsys):
    for command in readme_commands():
        if command in RUN:
            assert main(argv(command, values) + RUN[command]) == 0, (
                command, capsys.readouterr())
        else:
            check_parses(command, values, capsys)


def test_every_docs_command_parses(values, capsys):
    commands = docs_commands()
    assert len(commands) >= 8, commands
    for command in commands:
        check_parses(command, values, capsys)


def test_every_readme_task_option_exists():
    """Each ``-o KEY=VALUE`` of the README is an option of some task (a
    placeholder value ``N`` taken as 1)."""
    options = [re.sub(r'=N$', '=1', option)
               for option in re.findall(r'-o ([a-z_]+=[^\s`]+)', README)]
    assert len(options) >= 10, options
    for option in options:
        accepted = []
        for task in TASKS.values():
            try:
                task.parse_option(option)
                accepted.append(task.name)
            except ValueError:
                pass
        assert accepted, f"README's -o {option} is no option of any task"
