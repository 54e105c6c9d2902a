"""Every ``pyg-metric-attn`` and ``make`` command the README and the
documentation's pages (``docs/``) show works as written: the cheap ones run
(at one epoch), the long ones must at least be accepted by the command line's
parser (``make``: a dry run), and every ``-o KEY=VALUE`` they show is an
option of some task. The README's Python blocks run. A command or a block
added or changed is checked the same way, so neither can drift from the code.

What the README shows of work still in progress is listed in ``PENDING``:
checked to fail until it works, and then failing until it is taken out."""
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

#: Commands of the README or the docs that run here as written (``--epochs N``
#: as one epoch), with these flags appended.
RUN = {
    'pyg-metric-attn train moon --attention l2 -o validation=100 --out RUN':
        ['--epochs', '1', '--no-progress'],
    'pyg-metric-attn evaluate moon RUN --split val': [],
    'pyg-metric-attn experiment NAME --attention metric,l2,dot,gat --seeds 10 '
    '[--epochs N] [--out runs/NAME] [-o KEY=VALUE ...]':
        ['--no-progress'],
}


#: The mesh job as a product (issue 58), shown by the README before the code
#: has it: a command the parser does not accept yet, and a Python block (the
#: one that contains the key) that does not run yet. Each is checked to fail;
#: once it works its test fails, naming the entry to delete here, so that it
#: is checked like the rest.
PENDING_COMMANDS: dict[str, str] = {}
PENDING_BLOCKS: dict[str, str] = {}


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


def readme_python_blocks() -> list[str]:
    """The README's ``python`` code blocks."""
    return re.findall(r'^```python\n(.*?)^```', README, re.M | re.S)


def pending_block(block: str) -> str | None:
    """The key of ``PENDING_BLOCKS`` that ``block`` contains, if any."""
    return next((key for key in PENDING_BLOCKS if key in block), None)


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


def test_the_readme_and_docs_show_the_commands_that_run_here():
    commands = readme_commands()
    assert {'make demo', 'make test'} <= set(commands), commands
    assert len(commands) >= 4, commands
    shown = set(commands) | set(docs_commands())
    assert set(RUN) <= shown, sorted(set(RUN) - shown)


@pytest.mark.usefixtures('one_thread')
def test_every_readme_and_docs_command_runs_or_parses(values, capsys):
    for command in dict.fromkeys(readme_commands() + docs_commands()):
        if command in PENDING_COMMANDS:
            continue
        if command in RUN:
            assert main(argv(command, values) + RUN[command]) == 0, (
                command, capsys.readouterr())
        else:
            check_parses(command, values, capsys)


def test_pending_readme_commands_do_not_parse_yet(values, capsys):
    """Each command of ``PENDING_COMMANDS`` is in the README and is refused by
    today's parser; when it is accepted, delete its entry."""
    assert set(PENDING_COMMANDS) <= set(readme_commands())
    for command, reason in PENDING_COMMANDS.items():
        try:
            build_parser().parse_args(argv(command, values))
        except SystemExit:
            capsys.readouterr()
            continue
        pytest.fail(f"{command!r} parses now ({reason}): delete it from "
                    f"PENDING_COMMANDS in {Path(__file__).name} so that it is "
                    f"checked like the others")


def test_the_readme_python_blocks_run(values):
    """Every ``python`` block of the README runs in an empty folder (with
    ``mesh.obj`` in it); a block of ``PENDING_BLOCKS`` must still fail, and
    once it runs its entry is to be deleted."""
    blocks = readme_python_blocks()
    assert len(blocks) >= 3, blocks
    for block in blocks:
        code = compile(block, 'README.md', 'exec')
        key = pending_block(block)
        if key is None:
            exec(code, {'__name__': 'readme'})
            continue
        try:
            exec(code, {'__name__': 'readme'})
        except Exception:  # noqa: BLE001 - expected while pending, any error
            continue
        pytest.fail(f"the README block with {key!r} runs now "
                    f"({PENDING_BLOCKS[key]}): delete it from PENDING_BLOCKS in "
                    f"{Path(__file__).name} so that it is checked like the others")
    assert sorted(filter(None, map(pending_block, blocks))) == sorted(PENDING_BLOCKS)


def test_every_readme_and_docs_task_option_exists():
    """Each ``-o KEY=VALUE`` of the README and the docs' pages is an option of
    some task (a placeholder value in capitals, ``N``, taken as 1)."""
    text = README + ''.join(page.read_text()
                            for page in sorted((ROOT / 'docs').rglob('*.rst')))
    options = [re.sub(r'=[A-Z]+$', '=1', option)
               for option in re.findall(r'-o ([a-z_]+=[^\s`]+)', text)]
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
