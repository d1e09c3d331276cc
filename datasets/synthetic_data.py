"""LightningDataModule for the synthetic reasoning tasks (``zoo.datasets.synthetic``).

Training windows are generated on the fly: window i is built from instances drawn with a generator seeded
by (seed, i), so an epoch is reproducible, any window can be fetched in any order by any worker, and
nothing is stored. Validation / test windows hold instances at the hardest size only (the paper's
evaluation), from seeds disjoint from training's.

A batch is a dict: ``input`` (B, T) token ids, ``target`` (B, T) the next tokens, ``answer`` (B, T) the
answer id of each target token (-1: no loss), ``tag`` (B, T) (Depo: the query's hop count k).
"""
from __future__ import annotations

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ._base import EpochLoader
from .synthetic import make_task, pack_window

__all__ = ['SyntheticLMDataModule', 'SyntheticWindows']


class SyntheticWindows(Dataset):
    """``size`` windows of ``context`` tokens; window i is a pure function of (seed, i)."""

    def __init__(self, task, context: int, size: int, seed: int, hardest: bool = False, task_kwargs: dict | None = None):
        self.task, self.context, self.size, self.seed, self.hardest = task, context, size, seed, hardest
        self.task_kwargs = task_kwargs or {}

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.size:
            raise IndexError(i)
        rng = np.random.default_rng([self.seed, i])
        tok, ans, tag, _ = pack_window(self.task, rng, self.context + 1, self.hardest, **self.task_kwargs)
        # targets are the next tokens: the answer id / tag of position t describe token t+1
        return {'input': torch.from_numpy(tok[:-1]), 'target': torch.from_numpy(tok[1:]),
                'answer': torch.from_numpy(ans[1:]), 'tag': torch.from_numpy(tag[1:])}


class SyntheticLMDataModule(L.LightningDataModule):
    """Token copy, Depo1/Depo2 (and Depo1-mini), Brevo1/Brevo2 and Mano as language-modelling data.

    Args:
        task: ``copy``, ``depo1``, ``depo1_mini``, ``depo2``, ``brevo1``, ``brevo2`` or ``mano``.
        task_args: the task's size arguments (e.g. ``{N: 64}`` for copy, ``{N: 24, K: 4}`` for Depo).
        context_length: tokens per window (T). batch_size: windows per batch.
        train_windows / val_windows: windows per training epoch / in the evaluation set.
        seed: data seed (identical across the architectures being compared).
        eval_k: Depo only: the evaluation queries' hop counts (default ``(K, K/2)``, each query drawing one;
            ``val/acc`` is measured at k = K and ``val/acc_tag<K/2>`` at K/2).
    """

    zoo_task = 'language_modeling'  # the registry task (``self.task`` is the reasoning task generated)

    def __init__(self, task: str = 'copy', task_args: dict | None = None, context_length: int = 130,
                 batch_size: int = 32, train_windows: int = 96_000, val_windows: int = 64, seed: int = 0,
                 eval_k: int | list[int] | None = None, num_workers: int = 0):
        super().__init__()
        self.save_hyperparameters()
        self.task = make_task(task, **(task_args or {}))
        self.task_name = task
        self.vocab_size = self.task.vocab_size
        self.context_length, self.batch_size, self.num_workers = context_length, batch_size, num_workers
        eval_kwargs = {}
        # which answers `val/acc` counts (by tag): Depo at k = K, Mano the value token, else all
        self.acc_tag = None
        if hasattr(self.task, 'K'):
            eval_kwargs['k'] = tuple(eval_k) if isinstance(eval_k, (list, tuple)) else (
                eval_k or tuple(sorted({self.task.K, max(1, self.task.K // 2)}, reverse=True)))
            self.acc_tag = max(eval_kwargs['k'])
        elif hasattr(self.task, 'L'):
            self.acc_tag = 1
        self.train_set = SyntheticWindows(self.task, context_length, train_windows, seed)
        # evaluation seeds are offset far away from training's (and test from validation's)
        self.val_set = SyntheticWindows(self.task, context_length, val_windows, seed + 1_000_003, True, eval_kwargs)
        self.test_set = SyntheticWindows(self.task, context_length, val_windows, seed + 2_000_003, True, eval_kwargs)

    def generative_eval_instances(self, count: int, seed_offset: int = 3_000_017) -> list:
        """Instances at the hardest size for generation-based metrics (Brevo: the whole answer is generated)."""
        rng = np.random.default_rng(self.hparams.seed + seed_offset)
        return [self.task.hardest(rng) for _ in range(count)]

    def _loader(self, ds, shuffle: bool) -> DataLoader:
        return EpochLoader(ds, batch_size=self.batch_size, shuffle=shuffle, seed=self.hparams.seed,
                           num_workers=self.num_workers)

    def train_dataloader(self):
        return self._loader(self.train_set, True)

    def val_dataloader(self):
        return self._loader(self.val_set, False)

    def test_dataloader(self):
        return self._loader(self.test_set, False)
