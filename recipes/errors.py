"""What a user sees when something is wrong, and what they do not need to see.

- :func:`one_line_error`: jsonargparse's / LightningCLI's nested error report as one line -- the innermost
  reason, the option it concerns, the value given and close matches (option names, a class's arguments, a
  module's classes).
- :func:`usage_errors`: the exception types that mean bad input (exit code 2, one line).
- :func:`quiet_lightning`: Lightning's warnings and info lines that are advertisements, about our own set-up or
  about facts a CPU user cannot act on.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import logging
import re
import warnings

from zoo._console import close_matches

__all__ = ['one_line_error', 'usage_errors', 'quiet_lightning', 'close_matches', 'subcommand_parser', 'at_least']


def _import(class_path: str):
    module, _, name = class_path.rpartition('.')
    return getattr(importlib.import_module(module), name)


# jsonargparse's report around the reason: which Union members were tried, the value's repr, ...
_BOILERPLATE = re.compile(r"^(- )?(Parser key |Does not validate against any of the Union subtypes|Subtypes: |Errors:"
                          r"|Given value type: |Given value: |Expected a <class 'NoneType'>|Problem with given class_path"
                          r"|Expected a path but )")


def subcommand_parser(parser, sub: str | None):
    action = getattr(parser, '_subcommands_action', None)
    return action._name_parser_map.get(sub, parser) if action is not None and sub else parser


def _option_names(parser) -> list[str]:
    return [o for a in getattr(parser, '_actions', []) for o in a.option_strings if o.startswith('--')]


def at_least(minimum: int | float, kind: type = int):
    """An argparse ``type``: a number of ``kind`` not below ``minimum``, so ``--batch-size 0`` or ``--threads -1``
    stops at parsing with one line (exit 2) instead of a traceback, or a silent default, further on."""
    what = 'an integer' if kind is int else 'a number'

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f'expected {what} >= {minimum}, got {text!r}') from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f'expected {what} >= {minimum}, got {text}')
        return value

    return parse


def one_line_error(message: str, parser=None) -> str:
    """One line from a jsonargparse/LightningCLI error: the innermost reason, the option it concerns, the value
    given and close matches (option names, a class's arguments, a module's classes)."""
    try:
        return _one_line_error(message.strip(), parser)
    except Exception:  # a report shaped in a way we did not foresee: still one line, nothing lost
        return ' '.join(message.split())


def _one_line_error(text: str, parser) -> str:
    prog = str(getattr(parser, 'prog', None) or 'zoo COMMAND').replace(' [options]', '')
    unknown = re.match(r'unrecognized arguments: (\S+)', text)
    if unknown:
        option = unknown.group(1).split('=', 1)[0]
        what = f'unknown option {option}' if option.startswith('-') else f'unexpected argument {option!r}'
        return f'{what}{close_matches(option, _option_names(parser))} (`{prog} --help` lists the options)'
    if text.startswith('the following arguments are required') and ('model' in text or 'data' in text):
        return f'{text} (a recipe gives both: -c recipes/configs/<family>/<name>.yaml; `{prog} --help`)'
    if not re.search(r'Parser key "|Does not validate against|Problem with given class_path', text):
        return ' '.join(text.split())  # not jsonargparse's nested report: the message, on one line
    keys = re.findall(r'Parser key "([^"]+)"', text)
    given = re.findall(r'^\s*Given value: (.*)$', text, flags=re.M)
    class_path = re.findall(r"Problem with given class_path '([^']+)'", text)
    reasons = [(len(line) - len(line.lstrip()), line.strip()) for line in text.splitlines()]
    reasons = [(depth, r[2:] if r.startswith('- ') else r) for depth, r in reasons
               if r and not _BOILERPLATE.match(r)]
    if not reasons:
        return ' '.join(text.split())
    reason = max(reasons, key=lambda dr: dr[0])[1].strip('"')  # the deepest line is the innermost cause
    reason = re.sub(r"<class '(?:[\w]+\.)*(\w+)'>", r'\1', reason)
    option = '--' + '.'.join(keys) if keys else ''
    rejected = re.match(r"Option '([^']+)' is not accepted", reason)
    if rejected and class_path:
        try:
            accepted = list(inspect.signature(_import(class_path[-1])).parameters)
        except Exception:  # the class itself is the problem; say what we know
            accepted = []
        arg = rejected.group(1)
        return (f'{option}.{arg}: {class_path[-1]} takes no argument {arg!r}{close_matches(arg, accepted)}'
                + (f" (it takes: {', '.join(accepted)})" if accepted and not close_matches(arg, accepted) else ''))
    missing = re.match(r"module '([\w.]+)' has no attribute '(\w+)'", reason)
    if missing:
        try:
            names = dir(importlib.import_module(missing.group(1)))
        except Exception:
            names = []
        return f'{option}: no class {missing.group(2)} in {missing.group(1)}{close_matches(missing.group(2), names)}'
    typed = re.match(r'Expected an? (\w+)', reason)
    if typed and given:
        return f'{option} expects {typed.group(1)}, got {given[0]}'
    return f'{option}: {reason}' if option else reason


def usage_errors() -> tuple[type[Exception], ...]:
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    return (KeyError, ValueError, TypeError, FileNotFoundError, FloatingPointError, ImportError,
            MisconfigurationException, argparse.ArgumentError)


# Printed on every run and nothing a user can act on:
_NOISE = (
    '.*args parameter is intended',  # `python -m zoo.recipes.main fit ...` passes sys.argv on purpose
    # A fresh fit runs in a new, empty run folder; with OnExceptionCheckpoint among the callbacks Lightning
    # turns `ckpt_path=None` into 'last', finds no checkpoint there and warns twice. Nothing is loaded.
    r'.*\.fit\(ckpt_path=None\)` was called without a model',
    r'.*\.fit\(ckpt_path="last"\) is set, but there is no last checkpoint',
    # Lightning 2.6's own call into torch.utils._pytree, deprecated in this torch; not our code.
    r'.*isinstance\(treespec, LeafSpec\)` is deprecated',
    # The CSV logger writes into the new run folder, which already holds the run's manifest (run.json).
    r'Experiment logs directory .* exists and is not empty',
    # Evaluating (or resuming from) a checkpoint of another run folder: every run writes into its own new
    # folder by design, so the checkpoint callback's saved dirpath always differs. Nothing is lost.
    r'The dirpath has changed from',
)


class _DropLightningTips(logging.Filter):
    """Lightning's info lines that are advertisements or about our own callbacks, not about the run."""
    patterns = ('litlogger', 'already configured with model summary callbacks',
                'GPU available: False', 'TPU available: False',  # nothing to act on (True is still said)
                'Seed set to',  # the seed is in the run's config.yaml and database row
                'to estimate number of stepping batches')  # our schedule asks Lightning for the step count

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(p in str(record.msg) for p in self.patterns)


@contextlib.contextmanager
def quiet_lightning():
    """Within: Lightning's warnings and info lines that are noise to a user (:data:`_NOISE`, :class:`_DropLightningTips`)
    are not shown."""
    _quiet_lightning_logs()
    with warnings.catch_warnings():
        for message in _NOISE:
            warnings.filterwarnings('ignore', message=message)
        yield


def _quiet_lightning_logs() -> None:
    for name in ('lightning.pytorch.utilities.rank_zero', 'lightning.fabric.utilities.rank_zero',
                 'lightning.fabric.utilities.seed'):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLightningTips) for f in logger.filters):
            logger.addFilter(_DropLightningTips())
