"""What every run records: the results database's run row (a Lightning ``Logger``) and per-epoch statistics.

:class:`ResultsLogger` is a Lightning logger: Lightning hands it the system when a fit / validate / test starts
(``log_graph``), every logged metric (``log_metrics``: per step, per epoch, at the end) and how the run ended
(``finalize``). It writes the run row (model, task, dataset, block choices, the network spec ``zoo bench``
rebuilds it from, the resolved config, seed, git commit, environment), its metrics with their epoch and step,
the final values, the status (``finished``; ``failed`` on an exception, with its error, or ``pruned`` when an
Optuna pruner stops it) and, after training, the network's batch-1 CPU latency
(controlled: warm-up, time-bounded repeats, median and IQR, load average) with its parameters, MACs and
architecture fingerprint. While the run lasts, a heartbeat thread refreshes its ``heartbeat_at`` every
``$ZOO_HEARTBEAT_S`` seconds (default 60); a run killed outright stays ``running`` with its host and pid, and
the next process that opens the store marks it ``crashed``. Only global rank 0 writes.

:class:`EpochStats` logs each training epoch's wall time, samples/s and peak memory.
"""
from __future__ import annotations

import copy
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

from zoo.eval import results as _results

__all__ = ['TrialContext', 'ResultsLogger', 'EpochStats', 'LATENCY_ENV']

# Environment switch for the end-of-training latency measurement ("0" turns it off).
LATENCY_ENV = 'ZOO_RECORD_LATENCY'
# Set by ``zoo benchmark run`` for the ``zoo fit`` it starts: the id of the run row it wrote for the job (the
# logger takes that row over, as a sweep trial's) and the job's identity (name, group, entry, key), stored in
# the run's hparams as ``benchmark`` (not part of the config key: the same configuration in two benchmarks is
# one configuration).
RUN_ID_ENV = 'ZOO_RUN_ID'
BENCHMARK_ENV = 'ZOO_BENCHMARK_JOB'


@dataclass
class TrialContext:
    """What a sweep trial shares with the run it starts (``zoo sweep`` passes it to ``run_cli(trial=...)``; the
    logger fills in the outcome, the sweep reads it back)."""
    study_name: str
    trial_number: int
    db: str | None = None                             # the sweep's database URL (runs are recorded there)
    callbacks: list = field(default_factory=list)   # extra Lightning callbacks (the pruner)
    run_id: int | None = None                         # written by the sweep, filled in by ResultsLogger
    claimed: bool = False                             # a ResultsLogger has taken over run_id
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
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != 'epoch':
            out[k] = float(v)
    return out


def _relative(path) -> str:
    """A recipe path as the docs write it (relative to the working directory) when it lies below it."""
    p = os.path.abspath(str(path))
    cwd = os.getcwd()
    return os.path.relpath(p, cwd) if p.startswith(cwd + os.sep) else str(path)


class ResultsLogger(Logger):
    """Write a run, its metrics and its latency to the results database (see the module docstring).

    Args:
        db: path or SQLAlchemy URL (default ``$ZOO_DB`` or ``./zoo-results.db``).
        latency: measure the trained network's latency at batch 1 when fit ends.
        latency_repeats / latency_warmup / latency_budget_s: ``zoo.eval.profile``'s protocol (more calls while
            time remains; median and IQR recorded with the load average).
        trial: the ``TrialContext`` of the sweep trial this run belongs to.
        recipe / config: the config file(s) and the resolved config (``zoo fit`` passes LightningCLI's);
            without them, what the system and data module declare.
    """

    def __init__(self, db: str | None = None, latency: bool | None = None, latency_repeats: int = 20,
                 latency_warmup: int = 5, latency_budget_s: float = 1.0, trial: TrialContext | None = None,
                 recipe: str | None = None, config: dict | None = None):
        super().__init__()
        self.db, self.trial, self.recipe, self.config = db, trial, recipe, config
        self.latency = os.environ.get(LATENCY_ENV, '1') != '0' if latency is None else latency
        self.latency_repeats, self.latency_warmup, self.latency_budget_s = (latency_repeats, latency_warmup,
                                                                            latency_budget_s)
        self.run_id: int | None = None
        self.own_row = False  # run_id is a row this logger started (not a sweep trial's or a benchmark job's)
        self.latency_ms: float | None = None
        self.heartbeats = 0
        self._store = self._heartbeat = self._system = None
        self._last: dict[str, float] = {}

    @property
    def name(self) -> str:
        return 'zoo-results'

    @property
    def version(self) -> int | None:
        return self.run_id

    # -- the run row -------------------------------------------------------------------------------------------
    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        """The system's hyper-parameters are stored with the run row (``log_graph``, which gets the system)."""

    @rank_zero_only
    def log_graph(self, model, input_array=None) -> None:
        """Called by Lightning as a fit / validate / test starts, with the system: start the run row."""
        trainer = model.trainer
        stage = trainer.state.fn.value if trainer.state.fn is not None else 'fit'
        if stage == 'predict':
            return
        self._system, self._stage, self._last = model, stage, {}
        self._store = _results.open_db(self.db or (self.trial.db if self.trial is not None else None))
        fields = self._describe(trainer, model, stage)
        claimed = os.environ.pop(RUN_ID_ENV, None)      # once: a later stage of this process is a run of its own
        if self.trial is not None and self.trial.run_id is not None and not self.trial.claimed:
            self.run_id = self.trial.run_id            # the row the sweep wrote when the trial started
            self._store.update_run(self.run_id, **fields)
        elif claimed:                                  # the row ``zoo benchmark run`` wrote for this job
            self.run_id = int(claimed)
            self._store.claim_run(self.run_id, **fields)
        else:
            self.run_id = self._store.start_run(**fields)
        self.own_row = not (self.trial is not None or claimed)
        if self.trial is not None:
            self.trial.run_id, self.trial.claimed = self.run_id, True
        self._stop_heartbeat()
        self._heartbeat = self._store.start_heartbeat(self.run_id)

    def _describe(self, trainer, system, stage: str) -> dict:
        hparams = _results.jsonable(dict(getattr(system, 'hparams', {}) or {}))
        # the runtime that ran the network (zoo test --runtime onnxruntime, zoo fit --compile): its own column;
        # at their defaults these keys (and grad_checkpointing) stay out of the hyper-parameters, so the configuration key is the same as
        # runs recorded before they existed
        runtime = hparams.pop('runtime', None) or 'eager'
        compiled = hparams.pop('compile', False)
        if not hparams.get('grad_checkpointing', True):  # the default, likewise out of the configuration key
            hparams.pop('grad_checkpointing')
        if runtime != 'eager':
            hparams['runtime'] = runtime
        if compiled:
            hparams['compile'] = compiled
            runtime = 'compile' if runtime == 'eager' else runtime
        name = getattr(system, 'model_name', None) or hparams.get('name') or type(system).__name__
        family = variant = None
        task = getattr(system, 'task', None) or None
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
        config = self.config if self.config is not None else {
            'model': hparams, 'data': _results.jsonable(dict(getattr(dm, 'hparams', {}) or {})),
            'trainer': {'max_epochs': trainer.max_epochs, 'max_steps': trainer.max_steps,
                        'fast_dev_run': trainer.fast_dev_run, 'precision': str(trainer.precision)}}
        seed = os.environ.get('PL_GLOBAL_SEED')
        if seed is None and isinstance(config, dict):
            seed = config.get('seed_everything')
        # the system's whole configuration (its injected optimizer and schedule included): what makes runs
        # repeats of one configuration
        system_cfg = config.get('model', {}).get('init_args') if isinstance(config.get('model'), dict) else None
        for k in ('optimizer', 'lr_scheduler'):
            if isinstance(system_cfg, dict) and system_cfg.get(k) is not None:
                hparams[k] = system_cfg[k]
        network = getattr(system, 'network', None)
        if isinstance(network, dict):  # what zoo bench --db rebuilds the network from
            hparams['network'] = _results.jsonable({**network, 'input_size': self._input_size(trainer, system)})
        fields = dict(model=name, variant=variant, family=family, task=task, dataset=dataset, stage=stage,
                      runtime=runtime,
                      recipe=self.recipe, config=config, hparams=hparams,
                      block_choices=dict(getattr(system, 'block_choices', {}) or {}),
                      seed=int(seed) if seed not in (None, True, False) else None,
                      max_epochs=trainer.max_epochs if stage == 'fit' else None, git_commit=_results.git_commit(),
                      env={**_results.environment(self._device(trainer)), 'precision': str(trainer.precision),
                           'devices': trainer.num_devices, 'strategy': type(trainer.strategy).__name__},
                      study_name=self.trial.study_name if self.trial is not None else None,
                      trial_number=self.trial.trial_number if self.trial is not None else None)
        fields['config_key'] = _results.config_key(name, dataset, {k: v for k, v in hparams.items() if k != 'network'},
                                                   fields['block_choices'], fields['max_epochs'])
        job = os.environ.get(BENCHMARK_ENV)
        if job:
            import json
            hparams['benchmark'] = json.loads(job)
        self._hparams = hparams
        net = self._network(system)
        fields.update(arch_fingerprint=_results.fingerprint(net), params=sum(p.numel() for p in net.parameters()))
        return fields

    @staticmethod
    def _device(trainer) -> str:
        return type(trainer.accelerator).__name__.removesuffix('Accelerator').lower()

    @staticmethod
    def _network(system) -> torch.nn.Module:
        """The architecture inside the system (systems hold it as ``model``/``net``; else the system itself)."""
        for attr in ('model', 'net', 'network'):
            m = getattr(system, attr, None)
            if isinstance(m, torch.nn.Module):
                return m
        return system

    # -- metrics -----------------------------------------------------------------------------------------------
    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if self.run_id is None or getattr(self._system, 'trainer', None) is None \
                or self._system.trainer.sanity_checking:
            return
        values = _scalars(metrics)
        if not values:
            return
        epoch = metrics.get('epoch')
        epoch = int(epoch) if epoch is not None else None
        self._store.log_metrics(self.run_id, values, epoch=epoch, step=step)
        self._last.update(values)

    # -- the end -----------------------------------------------------------------------------------------------
    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Lightning's ``success`` / ``failed``: the final metrics (the last value of each), the status and,
        after a successful fit, the latency."""
        if self.run_id is None or self._system is None:
            return
        if self._last:
            self._store.log_metrics(self.run_id, self._last, final=True)
        ok = status == 'success'
        trainer = self._system.trainer
        if ok and self._stage == 'fit' and not trainer.fast_dev_run:
            self._record_network_stats(trainer, self._system)
            if self.latency:
                self._record_latency(trainer, self._system)  # a smoke run's latency is not worth its time
        self._stop_heartbeat()
        status, error = 'finished', None
        exception = None if ok else sys.exc_info()[1]  # Lightning finalizes inside its ``except`` block
        if not ok:
            status = 'pruned' if type(exception).__name__ == 'TrialPruned' else 'failed'
            error = f'{type(exception).__name__}: {exception}' if exception is not None else 'the run failed'
            if status == 'failed' and exception is not None:
                error += '\n' + ''.join(traceback.format_exception(exception)[-8:])
            error = error[:20000]
        self._store.finish_run(self.run_id, status, error=error)
        if self.trial is not None:
            self.trial.status, self.trial.error, self.trial.metrics = status, error, dict(self._last)
        self._system = None

    @rank_zero_only
    def discard(self) -> None:
        """Delete the row of a run rejected as bad input before it trained (``zoo fit`` leaves nothing behind
        then); a sweep trial's or a benchmark job's row belongs to them and stays, with its failure."""
        if self.run_id is not None and self.own_row:
            self._stop_heartbeat()
            self._store.delete_run(self.run_id)
            self.run_id, self.own_row = None, False

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self.heartbeats = self._heartbeat.beats        # how many the thread wrote (for the tests)
            self._heartbeat = None

    # -- latency -----------------------------------------------------------------------------------------------
    @staticmethod
    def _input_size(trainer, system) -> tuple | None:
        """One sample's shape as the run saw it (``zoo.tasks.input_size``): the registry's input size with the data
        module's image size and channels, or its context length for token ids."""
        from zoo import tasks

        name = getattr(system, 'model_name', None)
        if not isinstance(name, str):
            return None
        dm = trainer.datamodule
        try:
            return tasks.input_size(name, img_size=getattr(dm, 'img_size', None) or None,
                                    in_chans=getattr(dm, 'in_chans', None),
                                    context_length=getattr(dm, 'context_length', None),
                                    task=getattr(system, 'task', None) or None)
        except (KeyError, ValueError, TypeError):   # a system of an unregistered task
            return None

    def _example(self, trainer, system) -> tuple[torch.nn.Module, torch.Tensor | None]:
        """The network on the CPU in eval mode (a copy) and one batch-1 input at the size the run trained at."""
        from zoo.layers._torch_compat import drop_compiled_forward
        from zoo.tasks import example_input

        net = self._network(system)
        size = self._input_size(trainer, system)
        x = getattr(system, 'example_input_array', None)
        x = x[:1] if isinstance(x, torch.Tensor) else (example_input(net, size, 1, getattr(system, 'task', None))
                                                        if size is not None else None)
        # the default network: eager (not `zoo fit --compile`'s, whose runtime is `zoo bench --runtime compile`'s),
        # contiguous weights (not `channels_last`'s)
        net = copy.deepcopy(net).cpu().eval().to(memory_format=torch.contiguous_format)
        for module in net.modules():  # a DenseModel compiles its parts
            drop_compiled_forward(module)
        return net, x

    def _record_network_stats(self, trainer, system) -> None:
        """``zoo.eval.profile.network_stats`` of the trained network at batch 1 and its recorded input size, stored
        in the run's hparams as ``network_stats`` (``results.data()`` reads them)."""
        from zoo.eval.profile import network_stats

        net, x = self._example(trainer, system)
        if x is None:
            return
        try:
            stats = network_stats(net, x)
        except Exception as e:      # statistics must never fail a finished run
            stats = {'error': f'{type(e).__name__}: {e}'}
        self._hparams['network_stats'] = stats
        self._store.update_run(self.run_id, hparams=self._hparams)

    def _record_latency(self, trainer, system) -> None:
        """The trained network's batch-1 CPU latency with ``zoo bench``'s controlled protocol, recorded as
        ``source='fit'`` (the leaderboard prefers a later ``zoo bench`` record of the same network)."""
        from zoo.eval.profile import controlled_benchmark, count_macs, count_params

        net, x = self._example(trainer, system)
        if x is None:
            return
        name = getattr(system, 'model_name', None) or type(system).__name__
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
        if self.trial is not None:
            self.trial.latency_ms = lat.median_ms


def results_logger(db: str | None = None, trial: TrialContext | None = None, **kwargs) -> ResultsLogger | None:
    """The recording logger of a ``zoo fit/validate/test`` run, or None when the database is ``none`` (``zoo fit
    --db none`` or ``ZOO_DB=none``) and no sweep trial needs it."""
    recording = trial is not None or _results.resolve_url(db) is not None
    return ResultsLogger(db=db, trial=trial, **kwargs) if recording else None


class EpochStats(Callback):
    """Per training epoch: its wall time (``train/epoch_time_s``, validation excluded), training samples per
    second (``train/samples_per_s``) and peak memory (``train/peak_mem_mb``: CUDA's allocator peak, or the
    process's resident set on the CPU; ``zoo.eval.profile.peak_memory_mb``). Logged at every epoch's end, so
    every fit, however short and whatever its ``log_every_n_steps``, leaves them in ``metrics.csv`` and in the
    results database's per-epoch metrics (accuracy against training time is then a query). At every validation
    of a fit, ``train/elapsed_s``: the training wall time so far (validation excluded), logged with that check's
    metrics, so a validation inside an epoch (``val_check_interval``) has its time too (``zoo.eval.results.curves``)."""

    def __init__(self):
        self._samples, self._val_s, self._val_start, self._start = 0, 0.0, None, None
        self._trained_s = 0.0                   # training wall time of the epochs already ended

    def on_train_start(self, trainer, pl_module) -> None:
        self._trained_s, self._start = 0.0, None

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
        if self._start is not None and not trainer.sanity_checking and trainer.state.fn == 'fit':
            elapsed = self._trained_s + self._val_start - self._start - self._val_s
            pl_module.log('train/elapsed_s', elapsed, on_step=False, on_epoch=True, rank_zero_only=True)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._val_start is not None and self._start is not None and not trainer.sanity_checking:
            self._val_s += time.perf_counter() - self._val_start
        self._val_start = None

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        from zoo.eval.profile import peak_memory_mb

        seconds = time.perf_counter() - self._start - self._val_s  # Lightning validates before this hook
        self._trained_s += seconds
        stats = {'train/epoch_time_s': seconds, 'train/samples_per_s': self._samples / max(seconds, 1e-9)}
        peak = peak_memory_mb(pl_module.device)
        if peak is not None:
            stats['train/peak_mem_mb'] = peak
        for k, v in stats.items():
            pl_module.log(k, v, on_step=False, on_epoch=True, rank_zero_only=True)
