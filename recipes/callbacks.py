"""Lightning callbacks of every recipe run.

``ResultsCallback`` records a run in the results database (``zoo.eval.results``): the run row when
fit / validate / test starts, metrics per epoch and at the end, the final status (``finished``,
``failed`` on an exception, ``pruned`` when an Optuna pruner stops it) and, after training, the
model's batch-1 CPU latency (controlled: warm-up, time-bounded repeats, median and IQR, load average)
with its parameters, MACs and architecture fingerprint. While the run lasts,
a heartbeat thread refreshes its ``heartbeat_at`` every ``$ZOO_HEARTBEAT_S`` seconds (default 60). A run
killed outright stays ``running`` with its host and pid, and the next process that opens the store marks
it ``crashed``: at once on the same host (its pid is gone), within 5 heartbeat intervals elsewhere.
Only global rank 0 writes.
"""
from __future__ import annotations

import copy
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from zoo.eval import results as _results

# Environment switch for the end-of-training latency measurement ("0" turns it off).
LATENCY_ENV = 'ZOO_RECORD_LATENCY'


@dataclass
class TrialContext:
    """What a sweep trial shares with the recording callback of the run it starts (``zoo sweep`` passes it
    to ``run_cli(trial=...)``; the callback fills in the outcome, the sweep reads it back)."""
    study_name: str
    trial_number: int
    db: str | None = None                             # the sweep's database URL (runs are recorded there)
    callbacks: list = field(default_factory=list)   # extra Lightning callbacks (the pruner)
    run_id: int | None = None                         # written by the sweep, filled in by ResultsCallback
    claimed: bool = False                             # a ResultsCallback has taken over run_id
    status: str | None = None
    error: str | None = None
    metrics: dict = field(default_factory=dict)
    latency_ms: float | None = None


def _scalars(metrics: dict) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, torch.Tensor):
            if v.numel() != 1:
                continue
            v = v.item()
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    return out


def _relative(path) -> str:
    """A recipe path as the docs write it (relative to the working directory) when it lies below it."""
    p = os.path.abspath(str(path))
    cwd = os.getcwd()
    return os.path.relpath(p, cwd) if p.startswith(cwd + os.sep) else str(path)


class ResultsCallback(Callback):
    """Write the run, its metrics and its latency to the results database.

    Args:
        db: path or SQLAlchemy URL (default ``$ZOO_DB`` or ``./zoo-results.db``).
        latency: measure the trained model's latency at batch 1 when fit ends.
        latency_repeats / latency_warmup / latency_budget_s: the least timed calls, the warm-up calls and the
            time budget of that measurement (``zoo.eval.profile``'s protocol: more calls while time remains;
            median and IQR recorded with the load average).
        study_name / trial_number: link the run to an Optuna trial (set by ``zoo sweep``).
        trial: the ``TrialContext`` of the sweep trial this run belongs to.
        recipe / config: the config file and the resolved config; when not given they are taken from
            LightningCLI's ``SaveConfigCallback`` if the trainer has one, else the system's hparams.
    """

    def __init__(self, db: str | None = None, latency: bool | None = None, latency_repeats: int = 20,
                 latency_warmup: int = 5, latency_budget_s: float = 1.0, study_name: str | None = None,
                 trial_number: int | None = None,
                 recipe: str | None = None, config: dict | None = None, trial: TrialContext | None = None):
        self.db = db
        self.latency = os.environ.get(LATENCY_ENV, '1') != '0' if latency is None else latency
        self.latency_repeats, self.latency_warmup = latency_repeats, latency_warmup
        self.latency_budget_s = latency_budget_s
        self.study_name, self.trial_number = study_name, trial_number
        self.recipe, self.config = recipe, config
        self.run_id: int | None = None
        self.latency_ms: float | None = None
        self._trial = trial
        self._store = None
        self._stage: str | None = None
        self._closed = False
        self._heartbeat = None
        self.heartbeats = 0

    # ------------------------------------------------------------------------------------------ run row
    def setup(self, trainer, pl_module, stage: str) -> None:
        if not trainer.is_global_zero:
            return
        if self._trial is not None and self.study_name is None:
            self.study_name, self.trial_number = self._trial.study_name, self._trial.trial_number
        self._store = _results.open_db(self.db or (self._trial.db if self._trial is not None else None))
        self._stage, self._closed, self._final = stage, False, None
        fields = self._describe(trainer, pl_module, stage)
        self._hparams, self._fingerprint = fields['hparams'], fields.get('arch_fingerprint')
        if self._trial is not None and self._trial.run_id is not None and not self._trial.claimed:
            self.run_id = self._trial.run_id            # the row the sweep wrote when the trial started
            self._store.update_run(self.run_id, **fields)
        else:
            self.run_id = self._store.start_run(**fields)
        if self._trial is not None:
            self._trial.run_id, self._trial.claimed = self.run_id, True
        self._stop_heartbeat()
        self._heartbeat = self._store.start_heartbeat(self.run_id)

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self.heartbeats = self._heartbeat.beats        # how many the thread wrote (for the tests)
            self._heartbeat = None

    def _close(self, status: str, error: str | None = None, metrics: dict | None = None) -> None:
        self._closed = True
        self._stop_heartbeat()
        self._store.finish_run(self.run_id, status, error=error)
        if self._trial is not None:
            self._trial.status, self._trial.error = status, error
            self._trial.metrics.update(metrics or {})

    def _describe(self, trainer, pl_module, stage: str) -> dict:
        hparams = _results._jsonable(dict(getattr(pl_module, 'hparams', {}) or {}))
        name = getattr(pl_module, 'model_name', None) or hparams.get('name') or type(pl_module).__name__
        family = variant = None
        task = getattr(pl_module, 'task', None)
        try:
            import zoo
            info = zoo.model_info(name)
            family, task = info.family, task or info.task
            variant = name[len(family) + 1:] if name.startswith(family + '_') else name
        except (KeyError, ValueError):
            pass
        dm = trainer.datamodule
        dataset = (getattr(dm, 'dataset_name', None) or getattr(dm, 'name', None)
                   or (type(dm).__name__.removesuffix('DataModule').lower() if dm is not None else None))
        recipe, config = self._config(trainer)
        seed = os.environ.get('PL_GLOBAL_SEED')
        if seed is None and isinstance(config, dict):
            seed = config.get('seed_everything')
        net = self._network(pl_module)
        fields = dict(model=name, variant=variant, family=family, task=task, dataset=dataset, stage=stage,
                      recipe=recipe, config=config, hparams=hparams,
                      block_choices=dict(getattr(pl_module, 'block_choices', {}) or {}),
                      seed=int(seed) if seed not in (None, True, False) else None,
                      max_epochs=trainer.max_epochs if stage == 'fit' else None,
                      git_commit=_results.git_commit(),
                      env={**_results.environment(self._device(trainer)), 'precision': str(trainer.precision),
                           'devices': trainer.num_devices, 'strategy': type(trainer.strategy).__name__},
                      study_name=self.study_name, trial_number=self.trial_number)
        fields['config_key'] = _results.config_key(name, dataset, hparams, fields['block_choices'], fields['max_epochs'])
        if net is not None:
            fields.update(arch_fingerprint=_results.fingerprint(net), params=sum(p.numel() for p in net.parameters()))
        return fields

    @staticmethod
    def _device(trainer) -> str:
        return type(trainer.accelerator).__name__.removesuffix('Accelerator').lower()

    def _config(self, trainer) -> tuple[str | None, Any]:
        recipe, config = self.recipe, self.config
        if config is None:
            from lightning.pytorch.cli import SaveConfigCallback
            for cb in trainer.callbacks:
                if isinstance(cb, SaveConfigCallback):
                    ns = cb.config
                    config = cb.parser.dump(ns, format='json', skip_none=False)
                    import json
                    config = json.loads(config)
                    files = ns.get('config') or []
                    recipe = recipe or ','.join(_relative(getattr(f, 'relative', f)) for f in files) or None
                    break
            else:       # no SaveConfigCallback (fast_dev_run, a plain Trainer): what the objects declare
                config = {'model': _results._jsonable(dict(getattr(trainer.lightning_module, 'hparams', {}) or {})),
                          'data': _results._jsonable(dict(getattr(trainer.datamodule, 'hparams', {}) or {})),
                          'trainer': {'max_epochs': trainer.max_epochs, 'max_steps': trainer.max_steps,
                                      'fast_dev_run': trainer.fast_dev_run, 'precision': str(trainer.precision)}}
        return recipe, config

    @staticmethod
    def _network(pl_module) -> torch.nn.Module | None:
        """The architecture inside the system (systems hold it as ``model``/``net``; else the system itself)."""
        for attr in ('model', 'net', 'network'):
            m = getattr(pl_module, attr, None)
            if isinstance(m, torch.nn.Module):
                return m
        return pl_module

    def _refresh_hparams(self, pl_module) -> None:
        """Store the system's hyper-parameters and network fingerprint again once its own ``setup`` has run:
        some systems build their network only then (``CausalLM`` takes ``vocab_size`` from the data module),
        and ``zoo bench --db`` rebuilds the network from these. The configuration key stays the one computed
        at the start."""
        if self.run_id is None or getattr(self, '_hparams', None) is None:
            return
        fields = {}
        hparams = _results._jsonable(dict(getattr(pl_module, 'hparams', {}) or {}))
        if hparams != self._hparams:
            fields['hparams'] = hparams
        net = self._network(pl_module)
        if net is not None and _results.fingerprint(net) != self._fingerprint:
            fields.update(arch_fingerprint=_results.fingerprint(net), params=sum(p.numel() for p in net.parameters()))
        if fields:
            self._store.update_run(self.run_id, **fields)
        self._hparams = None                            # once per stage

    def on_fit_start(self, trainer, pl_module) -> None:
        self._refresh_hparams(pl_module)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._refresh_hparams(pl_module)

    def on_test_start(self, trainer, pl_module) -> None:
        self._refresh_hparams(pl_module)

    # ------------------------------------------------------------------------------------------ metrics
    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # Runs after the epoch's validation, so val/* of this epoch are in callback_metrics. In an epoch without
        # validation (check_val_every_n_epoch > 1) they still hold the last validation's values: not recorded.
        if self.run_id is not None and not trainer.sanity_checking:
            metrics = _scalars(trainer.callback_metrics)
            if getattr(self, '_validated_epoch', None) != trainer.current_epoch:
                metrics = {k: v for k, v in metrics.items() if not k.startswith('val/')}
            self._store.log_metrics(self.run_id, metrics, epoch=trainer.current_epoch, step=trainer.global_step)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._validated_epoch = trainer.current_epoch

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.run_id is None:
            return
        self._final = _scalars(trainer.callback_metrics)
        self._store.log_metrics(self.run_id, self._final, epoch=trainer.current_epoch, step=trainer.global_step,
                                final=True)
        if self.latency and not trainer.fast_dev_run:     # a smoke run's latency is not worth its time
            self._record_latency(trainer, pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.run_id is not None and self._stage == 'validate':
            self._final = _scalars(trainer.callback_metrics)
            self._store.log_metrics(self.run_id, self._final, final=True)

    def on_test_end(self, trainer, pl_module) -> None:
        if self.run_id is not None and self._stage == 'test':
            self._final = _scalars(trainer.callback_metrics)
            self._store.log_metrics(self.run_id, self._final, final=True)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self.run_id is not None and not self._closed:
            self._close('finished', metrics=getattr(self, '_final', None))

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self.run_id is None or self._closed:
            return
        pruned = type(exception).__name__ == 'TrialPruned'
        metrics = _scalars(trainer.callback_metrics)
        if metrics:     # what the run reached before it stopped
            self._store.log_metrics(self.run_id, metrics, epoch=trainer.current_epoch, step=trainer.global_step,
                                    final=True)
        err = f'{type(exception).__name__}: {exception}'
        if not pruned:
            err += '\n' + ''.join(traceback.format_exception(exception)[-8:])
        self._close('pruned' if pruned else 'failed', error=err[:20000], metrics=metrics)

    # ------------------------------------------------------------------------------------------ latency
    def _example_input(self, trainer, pl_module, net) -> torch.Tensor | None:
        """One sample as the run saw it: the system's ``example_input_array``, else the data module's image
        size or context length, else the registry's input size; token ids for a language model."""
        from zoo.eval.profile import example_input

        x = getattr(pl_module, 'example_input_array', None)
        if isinstance(x, torch.Tensor):
            return x[:1]
        task = getattr(pl_module, 'task', None)
        size = info = None
        try:
            import zoo
            info = zoo.model_info(getattr(pl_module, 'model_name', ''))
            task = task or info.task
        except (KeyError, ValueError, TypeError):
            pass
        dm = trainer.datamodule
        if task == 'language_modeling' and getattr(dm, 'context_length', None):
            size = (int(dm.context_length),)                                    # (T,): token ids
        elif dm is not None and getattr(dm, 'img_size', None):
            s = dm.img_size
            s = (s, s) if isinstance(s, int) else tuple(s)
            size = (getattr(dm, 'in_chans', 3), *s)
        elif info is not None:
            size = tuple(info.input_size)
        if size is None:
            return None
        return example_input(net, size, 1, task)

    def _record_latency(self, trainer, pl_module) -> None:
        """The trained network's batch-1 CPU latency with the controlled protocol of ``zoo bench``
        (``eval.profile.controlled_benchmark``: warm-up, at least ``latency_repeats`` timed calls within
        ``latency_budget_s`` seconds, median and IQR, the load average before and after), recorded as
        ``source='fit'``: the leaderboard prefers a later ``zoo bench`` record of the same network."""
        from zoo.eval.profile import controlled_benchmark, count_macs, count_params

        net = self._network(pl_module)
        x = self._example_input(trainer, pl_module, net)
        if net is None or x is None:
            return
        net = copy.deepcopy(net).cpu().eval()
        name = getattr(pl_module, 'model_name', None) or type(pl_module).__name__
        try:
            macs = count_macs(net, example=x)
        except Exception:       # a model the FLOP counter cannot trace still gets its latency
            macs = None
        lat = controlled_benchmark({name: net}, input_size=tuple(x.shape[1:]), inputs={name: x},
                                   budget_s=self.latency_budget_s, warmup=self.latency_warmup,
                                   repeats=self.latency_repeats)[name]
        params = count_params(net)['params']
        self._store.add_latency_record(lat.as_dict(), params=params, macs=macs, run_id=self.run_id, source='fit',
                                       arch_fingerprint=_results.fingerprint(net))
        self._store.update_run(self.run_id, macs=macs, params=params)
        self.latency_ms = lat.median_ms
        if self._trial is not None:
            self._trial.latency_ms = lat.median_ms


class EpochStats(Callback):
    """Per training epoch: its wall time (``train/epoch_time_s``, validation excluded), training samples per
    second (``train/samples_per_s``) and peak memory (``train/peak_mem_mb``: CUDA's allocator peak, or the
    process's resident set on the CPU; ``zoo.eval.profile.peak_memory_mb``). Logged at every epoch's end, so
    every fit, however short and whatever its ``log_every_n_steps``, leaves them in ``metrics.csv`` and in the
    results database's per-epoch metrics (accuracy against training time is then a query)."""

    def __init__(self):
        self._samples, self._val_s, self._val_start, self._start = 0, 0.0, None, None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        from zoo.eval.profile import reset_peak_memory

        reset_peak_memory(pl_module.device)
        self._samples, self._val_s, self._val_start = 0, 0.0, None
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        first = batch
        while isinstance(first, (list, tuple, dict)) and len(first):  # (images, targets), {'input': ...}
            first = next(iter(first.values())) if isinstance(first, dict) else first[0]
        self._samples += len(first) if isinstance(first, torch.Tensor) and first.ndim else 1

    def on_validation_start(self, trainer, pl_module) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._val_start is not None and self._start is not None and not trainer.sanity_checking:
            self._val_s += time.perf_counter() - self._val_start
        self._val_start = None

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        from zoo.eval.profile import peak_memory_mb

        seconds = time.perf_counter() - self._start - self._val_s  # Lightning validates before this hook
        stats = {'train/epoch_time_s': seconds, 'train/samples_per_s': self._samples / max(seconds, 1e-9)}
        peak = peak_memory_mb(pl_module.device)
        if peak is not None:
            stats['train/peak_mem_mb'] = peak
        for k, v in stats.items():
            pl_module.log(k, v, on_step=False, on_epoch=True, rank_zero_only=True)


def results_callbacks(db: str | None = None, trial: TrialContext | None = None) -> list[Callback]:
    """The recording callbacks of a ``zoo fit/validate/test`` run, for ``default_callbacks()``: a
    ``ResultsCallback`` unless the database is ``none`` (``zoo fit --db none`` or ``ZOO_DB=none``), plus
    the callbacks of the sweep trial this run belongs to (Optuna's pruning callback), if any."""
    recording = trial is not None or _results.resolve_url(db) is not None
    cbs: list[Callback] = [ResultsCallback(db=db, trial=trial)] if recording else []
    return cbs + (list(trial.callbacks) if trial is not None else [])
