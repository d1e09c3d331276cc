"""A rich console that does not squeeze tables when output is piped or captured, the progress lines of slow
steps, and the close-match hint of a one-line error."""
from __future__ import annotations

import contextlib
import difflib
import sys
import time


def console():
    from rich.console import Console
    return Console(width=None if sys.stdout.isatty() else 200)


@contextlib.contextmanager
def progress(what: str, prefix: str = 'zoo'):
    """One line on stderr before a step that runs silently for seconds to minutes (compiling, exporting) and one
    after it with its duration; nothing after when it fails (its error follows)."""
    print(f'{prefix}: {what} ...', file=sys.stderr, flush=True)
    start = time.perf_counter()
    yield
    print(f'{prefix}: {what} ... done in {time.perf_counter() - start:.1f} s', file=sys.stderr, flush=True)


def close_matches(word: str, choices, n: int = 3, cutoff: float = 0.6) -> str:
    """``'; did you mean a or b?'`` for the ``choices`` close to ``word`` (difflib), or ``''``: the tail of a
    one-line error (the CLI's, the DataModules', the recipes')."""
    found = difflib.get_close_matches(str(word), list(choices), n=n, cutoff=cutoff)
    return f"; did you mean {' or '.join(found)}?" if found else ''
