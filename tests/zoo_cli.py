"""``zoo`` as a user runs it: a subprocess of the console script, in a folder of the test's own.

The new-user tests (issue 42) go through the command line where the user met each defect; this is the one
runner they share. Runs go to ``<cwd>/runs`` and the results database to ``<cwd>/zoo-results.db`` unless the
test says otherwise; end-of-fit latency is off (``ZOO_RECORD_LATENCY=0``) unless the test turns it on.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def zoo(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600, stdin: str | None = None,
        stdout=None) -> subprocess.CompletedProcess:
    """``zoo ARGS`` in ``cwd``: returns the completed process (``returncode``, ``stdout``, ``stderr`` as text).
    ``stdout``: where the output goes instead of being captured (a file descriptor: a pipe whose reader left)."""
    full = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT / 'tests'), str(ROOT)]), 'OMP_NUM_THREADS': '1',
            'ZOO_RUNS': str(Path(cwd) / 'runs'), 'ZOO_DB': str(Path(cwd) / 'zoo-results.db'),
            'ZOO_RECORD_LATENCY': '0', **(env or {})}
    full.pop('ZOO_RUN_DIR', None)
    return subprocess.run([sys.executable, '-m', 'zoo.recipes.main', *map(str, args)], cwd=cwd, env=full,
                          stdout=subprocess.PIPE if stdout is None else stdout, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, input=stdin)


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
