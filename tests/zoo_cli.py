"""``zoo`` as a user runs it: a subprocess of the console script, in a folder of the test's own.

The new-user tests (issue 42) go through the command line where the user met each defect; this is the one
runner they share. Runs go to ``<cwd>/runs`` and the results database to ``<cwd>/zoo-results.db`` unless the
test says otherwise; end-of-fit latency is off (``ZOO_RECORD_LATENCY=0``) unless the test turns it on.

``zoo`` starts a fresh interpreter (it pays Lightning's import, 5-10 s on the 2-core CI machine): for what the
command line itself does (exit codes, the one error line, nothing left behind). ``zoo_in_process`` calls the same
``main`` in the test's process: for a fit a test only builds on, and for checks of what a command wrote.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _environment(cwd: Path, env: dict | None) -> dict:
    """The environment ``zoo`` runs in: this one, with the runs and the database in ``cwd`` and latency off."""
    full = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT / 'tests'), str(ROOT)]), 'OMP_NUM_THREADS': '1',
            'ZOO_RUNS': str(Path(cwd) / 'runs'), 'ZOO_DB': str(Path(cwd) / 'zoo-results.db'),
            'ZOO_RECORD_LATENCY': '0', **(env or {})}
    full.pop('ZOO_RUN_DIR', None)  # a fit sets it for its own run
    return full


def zoo(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600, stdin: str | None = None,
        stdout=None) -> subprocess.CompletedProcess:
    """``zoo ARGS`` in ``cwd``: returns the completed process (``returncode``, ``stdout``, ``stderr`` as text).
    ``stdout``: where the output goes instead of being captured (a file descriptor: a pipe whose reader left)."""
    full = _environment(cwd, env)
    return subprocess.run([sys.executable, '-m', 'zoo.recipes.main', *map(str, args)], cwd=cwd, env=full,
                          stdout=subprocess.PIPE if stdout is None else stdout, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, input=stdin)


def zoo_in_process(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``zoo ARGS`` as ``zoo`` runs it (``cwd``, the environment above), but through ``zoo.recipes.main.main`` in
    this process: the same result object, ``returncode`` being main's return (or its ``SystemExit``'s code) and
    ``stdout``/``stderr`` what it printed. One torch thread, as ``OMP_NUM_THREADS=1`` gives ``zoo`` (two threads of
    tiny ops on a busy 2-core machine are many times slower); the working folder, the environment and the thread
    count are restored afterwards."""
    import torch

    from zoo.eval import results
    from zoo.recipes.main import main

    old_cwd, old_env, threads = os.getcwd(), dict(os.environ), torch.get_num_threads()
    out, err = io.StringIO(), io.StringIO()
    os.environ.clear()
    os.environ.update(_environment(cwd, env))
    os.chdir(cwd)
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as e:  # argparse and LightningCLI exit: the exit code the interpreter would give
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if isinstance(e.code, str):
                    print(e.code, file=sys.stderr)
    finally:
        results.close_all()  # the command's database connections, as a process's end closes them
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(['zoo', *map(str, args)], code, out.getvalue(), err.getvalue())


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one line a rejected command printed on stderr (asserting it is one line, with no traceback)."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert 'Traceback' not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    return lines[0]


def tree(root: Path) -> set[str]:
    """Every file and folder below ``root`` (relative paths): compare before and after to show nothing was left."""
    root = Path(root)
    return {str(p.relative_to(root)) for p in root.rglob('*')} if root.exists() else set()


def db_runs(db: Path) -> int:
    """How many runs the results database at ``db`` holds (0 when there is no database file)."""
    if not Path(db).exists():
        return 0
    import sqlite3
    with sqlite3.connect(db) as con:
        try:
            return con.execute('select count(*) from zoo_runs').fetchone()[0]
        except sqlite3.OperationalError:  # a database without the runs table yet
            return 0
