"""A rich console that does not squeeze tables when output is piped or captured."""
from __future__ import annotations

import sys


def console():
    from rich.console import Console
    return Console(width=None if sys.stdout.isatty() else 200)
