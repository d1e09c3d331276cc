"""What a run records about where it ran: configuration key, git commit, environment."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess

# ----------------------------------------------------------------------------------------- fingerprints, keys
def config_key(model: str, dataset: str | None, hparams: dict | None, block_choices: dict | None,
               max_epochs: int | None) -> str:
    """What makes two runs repeats of one configuration: everything but the seed."""
    hp = {k: v for k, v in (hparams or {}).items() if k not in ('seed', 'seed_everything')}
    blob = json.dumps([model, dataset, hp, block_choices or {}, max_epochs], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def git_commit(path: str | None = None) -> str | None:
    """HEAD of the checkout (with '+dirty' when the working tree has changes), or None outside git."""
    cwd = path or os.path.dirname(os.path.abspath(__file__))  # any folder of the checkout
    try:
        sha = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=cwd, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if not sha:
            return None
        dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ('+dirty' if dirty else '')
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: str = 'cpu') -> dict:
    """The facts a number depends on, as columns of the run (not a file name, unlike timm's CSVs)."""
    import torch
    env = {'torch': torch.__version__, 'python': platform.python_version(), 'device': device,
           'threads': torch.get_num_threads(), 'cpu': _cpu_name(), 'os': platform.platform(terse=True)}
    if torch.cuda.is_available():
        env['cuda'] = torch.version.cuda
        env['gpu'] = torch.cuda.get_device_name()
    for mod in ('lightning', 'optuna'):
        try:
            env[mod] = __import__(mod).__version__ if mod in __import__('sys').modules else None
        except Exception:               # pragma: no cover - a broken install must not stop recording
            env[mod] = None
    return env


@functools.lru_cache(maxsize=None)
def _cpu_name() -> str:
    from ..profile import machine  # the one /proc/cpuinfo reader (latency rows use it too)
    return machine()['cpu_model']
