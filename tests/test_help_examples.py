"""Every example command line in `zoo --help`, `zoo COMMAND --help` and README's command-line section runs.

The examples are parsed out of the help texts and the README (not listed here), so a new or edited example is
tested without touching this file. Each runs through `zoo.recipes.main.main` exactly as written, in a copy of a
workspace that holds one finished demo run (so `--ckpt_path last|best` and `zoo results` have something to
read), with only budget arguments appended: training examples get one epoch of two batches, `zoo bench` a small
image and one repeat, `zoo sweep` one trial, `zoo benchmark run` only its `--dry-run` check and `zoo benchmark
report` the workspace's database. Later arguments override earlier ones, so the example's own arguments are all
parsed and used.
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zoo.recipes.main import DEMO, TRAIN_COMMANDS, build_parser, main, train_help, train_parser

ROOT = Path(__file__).resolve().parents[1]
FAST = ['--trainer.max_epochs=1', '--trainer.limit_train_batches=2', '--trainer.limit_val_batches=1',
        '--trainer.limit_test_batches=1', '--trainer.limit_predict_batches=1', '--trainer.enable_progress_bar=false']


def help_texts() -> dict[str, str]:
    """What `zoo --help` and every `zoo COMMAND --help` print."""
    parser = build_parser()
    texts = {'zoo --help': parser.format_help()}
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        texts[f'zoo {name} --help'] = train_help(name) if name in TRAIN_COMMANDS else sub.format_help()
    return texts


def readme_section() -> str:
    text = (ROOT / 'README.md').read_text()
    start = text.index('## The command line')
    return text[start:text.index('\n## ', start + 3)]


def example_lines() -> dict[str, str]:
    """Example command line -> where it was found (help lines and README lines that start with `zoo `)."""
    found = {}
    block = re.search(r'```bash\n(.*?)```', readme_section(), re.S).group(1)
    sources = [('README.md', line.split('  #')[0]) for line in block.splitlines()]
    sources += [(where, line) for where, text in help_texts().items() for line in text.splitlines()]
    seen = set()
    for where, line in sources:
        line = line.strip()
        if line.startswith('zoo ') and tuple(to_argv(line)) not in seen:  # README's `-c ...` = the help's demo
            seen.add(tuple(to_argv(line)))
            found[line] = where
    return found


def to_argv(line: str) -> list[str]:
    """An example as `main()` takes it: `...` is the demo config (README's shorthand), repository paths are
    absolute (the example runs in a temporary folder), and the budget arguments are appended."""
    argv = [DEMO if a == '...' else a for a in shlex.split(line)[1:]]
    argv = [str(ROOT / a) if a.startswith('recipes/') else a for a in argv]
    command = argv[0]
    if command in TRAIN_COMMANDS:
        resume = command == 'fit' and '--ckpt_path' in argv
        return argv + FAST + (['--trainer.max_epochs=2'] if resume else [])  # resume: one epoch more
    if command == 'bench' and argv[1].startswith('-'):  # no names: re-time the database's runs as they trained
        return argv + ['--repeats', '1', '--warmup', '0', '--time', '0']
    if command == 'bench':
        return argv + ['--img-size', '64', '--repeats', '1', '--warmup', '0']
    if command == 'benchmark':  # run: check the file only (a benchmark trains for hours); report: the
        # workspace's database, written into the example's folder (not the checkout's docs/)
        return argv + (['--dry-run'] if argv[1] == 'run' else ['--db', 'results.db', '--out', 'benchmark-report'])
    if command == 'sweep':  # one trial; the example's --trial-args kept, the budget added to it
        given = argv[argv.index('--trial-args') + 1] if '--trial-args' in argv else ''
        if '--trial-args' in argv:
            del argv[argv.index('--trial-args'):argv.index('--trial-args') + 2]
        return argv + ['--n-trials', '1', '--trial-args', ' '.join([given, *FAST])]
    return argv


EXAMPLES = example_lines()


# one pytest-xdist worker runs the whole file (make test: --dist loadgroup), so the module fixture below
# is built once
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope='module')
def workspace(tmp_path_factory):
    """One finished demo run (checkpoints, a database row with its latency), copied for every example."""
    base = tmp_path_factory.mktemp('workspace')
    mp = pytest.MonkeyPatch()
    mp.setenv('ZOO_RUNS', str(base / 'runs'))
    mp.setenv('ZOO_DB', str(base / 'results.db'))
    mp.delenv('ZOO_RUN_DIR', raising=False)
    try:
        assert main(['fit', '-c', str(ROOT / DEMO), *FAST]) == 0
    finally:
        mp.undo()
    return base


@pytest.mark.parametrize('line', list(EXAMPLES), ids=list(EXAMPLES))
def test_example_runs(line, workspace, tmp_path, monkeypatch, one_thread):
    shutil.copytree(workspace, tmp_path / 'ws')
    monkeypatch.chdir(tmp_path / 'ws')
    monkeypatch.setenv('ZOO_RUNS', str(tmp_path / 'ws' / 'runs'))
    monkeypatch.setenv('ZOO_DB', str(tmp_path / 'ws' / 'results.db'))
    monkeypatch.delenv('ZOO_RUN_DIR', raising=False)
    argv = to_argv(line)
    assert main(argv) == 0, f'{line} (from {EXAMPLES[line]})'
    if argv[0] == 'sweep':  # `zoo sweep` exits 0 when a trial fails (it is stored as failed): check the trial
        import optuna
        study = optuna.load_study(study_name=Path(argv[1]).stem, storage=f"sqlite:///{tmp_path / 'ws' / 'results.db'}")
        assert [t.state.name for t in study.trials] == ['COMPLETE'], line


def test_every_command_has_examples_and_readme_matches_help():
    """Every command has an example in `zoo --help` or its own --help, and the README's command-line section
    shows every command `zoo --help` lists (and no other)."""
    commands = set(build_parser()._subparsers._group_actions[0].choices)
    block = re.search(r'```bash\n(.*?)```', readme_section(), re.S).group(1)
    readme = {line.split()[1] for line in block.splitlines() if line.startswith('zoo ')}
    assert readme == commands, f'README lacks {commands - readme}; not commands: {readme - commands}'
    texts = help_texts()
    for command in commands:
        shown = texts['zoo --help'] + texts[f'zoo {command} --help']
        assert re.search(rf'^\s+zoo {command} ', shown, re.M), f'no example of zoo {command}'


def test_every_option_is_described():
    """Every option of every non-training command has a help text (the training commands: next test)."""
    parser = build_parser()
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        if name in TRAIN_COMMANDS:
            continue
        for action in sub._actions:
            assert action.help, f'zoo {name} {action.option_strings or action.dest}: no description'


def test_train_help_summary_names_real_options(capsys):
    """`zoo fit --help` is zoo's summary; every option it names is one LightningCLI accepts (`--help-all`)."""
    assert main(['fit', '--help']) == 0
    summary = capsys.readouterr().out
    assert '--seeds' in summary and '--db' in summary and '--help-all' in summary
    assert main(['fit', '--help-all']) == 0
    full = capsys.readouterr().out
    assert len(full.splitlines()) > 3 * len(summary.splitlines())
    own = re.sub(r'`zoo (?!fit)[^`]*`', '', summary)  # options of other commands it points to (`zoo list --recipes`)
    named = set(re.findall(r'(?<![\w-])--[a-z_]+(?:\.[a-z_]+)*', own)) - {'--help-all'}
    named -= {o for a in train_parser('fit')._actions for o in a.option_strings}  # zoo's own, before LightningCLI
    for option in sorted(named):
        if option.startswith(('--model.', '--data.')):  # a system's/DataModule's arguments: the examples run them
            continue
        assert re.search(rf'{re.escape(option)}\b', full), option


def test_train_help_loads_no_lightning():
    code = ("import sys; from zoo.recipes.main import main; assert main(['fit', '--help']) == 0; "
            "bad = [m for m in ('lightning', 'torch') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, '-c', code], check=True, cwd=ROOT, capture_output=True)
