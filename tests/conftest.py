"""Shared test helpers. Tests enumerate the registries: a new block or model is tested by registering it."""
from __future__ import annotations

import os
import sys

import pytest
import torch

import zoo

# Keep the suite fast and deterministic on the 2-core CI machine: `make test` runs two pytest workers
# (pytest-xdist), each on one thread; a plain `pytest` run uses both cores.
torch.set_num_threads(1 if os.environ.get('PYTEST_XDIST_WORKER') else min(2, os.cpu_count() or 1))
# The suite's own workers keep the machine busy, so no latency it takes would pass zoo's trust rule (load and
# IQR limits, zoo.eval.bench.untrusted); its figures are never published: no limits, here and in the zoo
# subprocesses the tests start. tests/test_latency_trust.py tests the rule with its real limits.
os.environ.setdefault('ZOO_BUSY_LOAD', 'inf')
os.environ.setdefault('ZOO_MAX_IQR_RATIO', 'inf')

NUM_CLASSES = 7


def example_input(name: str, batch: int = 2, seed: int = 0) -> torch.Tensor:
    """A seeded valid input for a registered model at its registry size: ``zoo.tasks.example_input`` (the one
    example-input function; a token task draws below the built model's vocabulary)."""
    task = zoo.tasks.get(zoo.model_info(name).task)
    model = zoo.create(name) if task.takes_tokens else None   # only token ids need the model (its vocabulary)
    return zoo.tasks.example_input(model, zoo.tasks.input_size(name), batch, task.name,
                                   generator=torch.Generator().manual_seed(seed))


def model_output(model, x):
    """Logits (or the main output) of any registered model; a dense model's head outputs before post-processing."""
    out = model.forward_raw(x) if hasattr(model, 'forward_raw') else model(x)
    if isinstance(out, list) and len(out) > 1 and all(isinstance(o, torch.Tensor) and o.ndim == 4 for o in out):
        return torch.cat([o.flatten(2) for o in out], 2)  # a detector's maps per level -> (B, C, sum HW)
    return out[0] if isinstance(out, (tuple, list)) else out


def one_error_line(capfd) -> str:
    """stderr at the file-descriptor level (Lightning's log handlers hold the real stderr) must be one line: it."""
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def one_thread():
    """Tiny models train faster on one thread (no OpenMP barriers per small op on a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def tmp_ckpt(tmp_path):
    return tmp_path / 'model.pth'


@pytest.fixture(autouse=True)
def _results_db_in_tmp(tmp_path_factory, monkeypatch):
    """Every `zoo fit/validate/test` records itself in the results database: tests write to a temporary
    one (per test), never to ./zoo-results.db in the checkout. Tests may set ZOO_DB themselves."""
    monkeypatch.setenv('ZOO_DB', str(tmp_path_factory.mktemp('zoo_db') / 'results.db'))


@pytest.fixture
def zoo_db(tmp_path, monkeypatch):
    """This test's own results database at ``tmp_path / 'results.db'`` (its path), closed after the test."""
    from zoo.eval import results as R

    path = tmp_path / 'results.db'
    monkeypatch.setenv('ZOO_DB', str(path))
    yield path
    R.close_all()


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """Run folders of `zoo fit/validate/...` under tmp; the runs root is also where `--ckpt_path last` looks."""
    root = tmp_path / 'runs'
    monkeypatch.setenv('ZOO_RUNS', str(root))
    monkeypatch.delenv('ZOO_RUN_DIR', raising=False)
    return root


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is when a record is emitted."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


@pytest.fixture(autouse=True)
def _library_logs_to_the_current_stderr():
    """Lightning's (and torchmetrics') log handlers keep the ``sys.stderr`` of the test that first imported them,
    which pytest closes when that test ends: point them at the current one (a real run has one stderr)."""
    import logging

    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.split('.')[0] in ('lightning', 'torchmetrics',
                                                                         'pytorch_lightning'):
            for handler in logger.handlers:
                if type(handler) is logging.StreamHandler and not isinstance(handler.stream, _CurrentStderr):
                    handler.stream = _CurrentStderr()  # not setStream: it flushes the closed one
    yield
