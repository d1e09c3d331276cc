"""``zoo fit|validate|test|predict``: LightningCLI over any zoo system and DataModule.

    zoo fit -c recipes/configs/poolformer/poolformer_tiny_digits_15e.yaml      # or -c poolformer/poolformer_tiny_digits_15e
    zoo fit -c ... --model.name metaformer_tiny --model.model_args '{token_mixer: attention}' --trainer.max_epochs 3
    zoo fit -c ... --ckpt_path last          # resume the latest run of this config
    zoo test -c ... --ckpt_path best         # evaluate the best checkpoint of the latest run
    zoo test -c ... --ckpt_path best --corruptions gaussian_noise,fog --severities 1,3,5   # robustness.py
    zoo predict -c ... --ckpt_path best      # the test split -> the task's prediction files in the run folder
    zoo predict -c ... --ckpt_path best --images DIR   # a folder of new images (zoo.datasets.images)
    zoo fit -c ... --print_config            # the resolved config

Model and data use LightningCLI's subclass form (``class_path`` + ``init_args``). The DataModule is built once;
the sizes it knows (``num_classes``, ``in_chans``, ``img_size``, ``vocab_size``) are linked into the system
(``link_arguments(apply_on='instantiate')``). Each run gets a new folder (``runs.py``: resolved ``config.yaml``,
``checkpoints/`` (``checkpointing.py``), ``metrics.csv``, ``run.json``), the default callbacks, a CSV logger and
the results-database logger (``recording.py``). Bad input is one line and exit code 2 (``errors.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from lightning.pytorch import Callback, LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

from . import runs
from ._lightning_compat import CkptPathHook
from .checkpointing import check_checkpoint_model, check_weights_fit, checkpoint_callbacks, read_checkpoint
from .errors import one_line_error, quiet_lightning, subcommand_parser, usage_errors

# The sizes a DataModule knows and a system takes (``ZooSystem``): linked from the data, never guessed twice.
SIZES = ('num_classes', 'in_chans', 'img_size', 'vocab_size')


def default_callbacks(run_dir: str | Path | None, monitor: str, mode: str, trial=None) -> list[Callback]:
    """The callbacks every run gets: progress bar, model summary, checkpoints (``checkpointing.py``), learning-rate
    monitor, per-epoch statistics, and the callbacks of the sweep trial this run belongs to (its pruner)."""
    from lightning.pytorch.callbacks import LearningRateMonitor, TQDMProgressBar

    from .recording import EpochStats

    ckpt_dir = str(Path(run_dir) / 'checkpoints') if run_dir is not None else None
    return [TQDMProgressBar(refresh_rate=10), model_summary(), *checkpoint_callbacks(ckpt_dir, monitor, mode),
            LearningRateMonitor(logging_interval='step'), EpochStats(),
            *(list(trial.callbacks) if trial is not None else [])]


def monitor_of(system) -> tuple[str, str]:
    """(metric, 'max' or 'min') the best checkpoint keeps: the system's ``monitor`` and ``monitor_mode`` (a
    ``ZooSystem`` takes both from its task), else those of its ``task`` (classification for a system without one)."""
    from zoo import tasks

    task = tasks.get(getattr(system, 'task', '') or 'classification')
    return getattr(system, 'monitor', None) or task.metric, getattr(system, 'monitor_mode', None) or task.mode


def model_summary() -> Callback:
    """Lightning's model summary without its FLOPs column and "Total FLOPs: 0": Lightning counts FLOPs only
    for a system with an ``example_input_array`` (ours take the input size from the data), so the 0 it
    printed was "not measured". The totals count the network once: a system's EMA copy (``ema``) is a second
    set of the same weights, not parameters of the model, so it is said apart ("EMA copy: N"). Params and
    MACs of a model: ``zoo bench NAME``."""
    from lightning.pytorch.callbacks import ModelSummary, RichModelSummary

    from ._lightning_compat import rich_available

    base = RichModelSummary if rich_available() else ModelSummary

    class ZooModelSummary(base):
        ema_params = ema_trainable = 0  # the parameters of the system's EMA copy (all of them, trainable ones)

        def on_fit_start(self, trainer, pl_module) -> None:
            # counted before Lightning's summary (made and printed in this hook), whose totals include the copy
            ema = getattr(pl_module, 'ema', None)
            params = list(ema.parameters()) if ema is not None else []
            self.ema_params = sum(p.numel() for p in params)
            self.ema_trainable = sum(p.numel() for p in params if p.requires_grad)
            super().on_fit_start(trainer, pl_module)

        def summarize(self, summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                      total_flops, **kwargs) -> None:
            network = total_parameters - self.ema_params
            trainable = trainable_parameters - self.ema_trainable
            model_size = model_size * network / total_parameters if total_parameters else model_size
            if total_flops:  # measured: Lightning's own table
                return base.summarize(summary_data, network, trainable, model_size, total_training_modes,
                                      total_flops, **kwargs)
            from lightning.pytorch.utilities.model_summary.model_summary import (get_formatted_model_size,
                                                                                get_human_readable_count)

            def count(n: int) -> str:
                return get_human_readable_count(int(n)).strip()

            columns = [(name, values) for name, values in summary_data if name != 'FLOPs']
            widths = [max(len(name), *(len(v) for v in values)) if values else len(name) for name, values in columns]
            lines = ['  '.join(name.ljust(w) for (name, _), w in zip(columns, widths))]
            lines += ['  '.join(v.ljust(w) for v, w in zip(row, widths)) for row in zip(*(v for _, v in columns))]
            lines.append(f'params: {count(network)} ({count(network - trainable)} frozen), '
                         f'{get_formatted_model_size(model_size)} MB'
                         + (f'; EMA copy: {count(self.ema_params)}' if self.ema_params else '')
                         + f"; modules in train mode: {total_training_modes['train']}, "
                           f"in eval mode: {total_training_modes['eval']}")
            print('\n'.join(lines))

    return ZooModelSummary()


def _init_args(ns) -> dict:
    args = ns.get('init_args') if ns is not None else None
    return dict(args.as_dict() if hasattr(args, 'as_dict') else (args or {}))


@dataclass
class Corruptions:
    """``zoo test --corruptions NAMES --severities 1,3,5 --corruptions-reference RUN``, checked
    (``zoo.datasets.corruptions.parse_corruptions``, ``parse_severities``)."""
    names: tuple[str, ...]
    severities: tuple[int, ...]
    reference: str | None = None


@dataclass
class CLIRun:
    """What one ``zoo fit|validate|test|predict`` returns: its exit code and its run folder."""
    code: int
    run_dir: Path | None = None
    made: tuple[Path, ...] = ()  # folders this run created, innermost first (removed again if it is rejected)


class ZooCLI(CkptPathHook, LightningCLI):
    """LightningCLI with run folders, the default callbacks and loggers, and data-linked model sizes.

    ``trial``: the sweep trial this run belongs to (``recipes.recording.TrialContext``), passed in by
    ``zoo sweep``; ``--db`` is a parsed argument (the results database of this run)."""

    def __init__(self, *args, trial=None, result: CLIRun | None = None, images: str | None = None,
                 corruptions: Corruptions | None = None, **kwargs):
        self.trial, self.result, self.run_dir, self.results_logger = trial, result or CLIRun(0), None, None
        self.images = images  # zoo predict --images DIR: the folder the predict split reads
        self.corruptions = corruptions  # zoo test --corruptions: the corrupted copies of the test split
        self._ckpt = self._resolved = None
        self._rank0 = True  # this process is the job's global rank 0 (set with the run folder)
        super().__init__(*args, **kwargs)

    def parse_arguments(self, parser, args) -> None:
        """jsonargparse's errors (usage plus a nested Union report) as one line with close matches."""
        try:
            super().parse_arguments(parser, args)
        except argparse.ArgumentError as e:
            sub = next((a for a in (args or []) if a in self.subcommands()), None) if isinstance(args, list) else None
            raise argparse.ArgumentError(None, one_line_error(str(e), subcommand_parser(parser, sub))) from None

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument('--run_root', default=os.environ.get('ZOO_RUNS', 'runs'),
                            help='runs are written to <run_root>/<config stem>/<timestamp>/ (env ZOO_RUNS)')
        parser.add_argument('--db', type=Optional[str], default=None,
                            help="results database of this run: a path, a SQLAlchemy URL or 'none' "
                                 "(default $ZOO_DB or ./zoo-results.db)")
        for size in SIZES:  # the DataModule is built first and once; what it knows, the system gets
            parser.link_arguments('data', f'model.init_args.{size}', apply_on='instantiate',
                                  compute_fn=lambda data, size=size: getattr(data, size, None))

    @staticmethod
    def _stem(cfg) -> str:
        configs = [c for c in (cfg.get('config') or []) if c]
        return Path(str(configs[-1])).stem if configs else str(_init_args(cfg.get('model')).get('name') or 'run')

    def resolve_ckpt_path(self) -> None:
        """Resolve ``--ckpt_path last|best|interrupted`` (``runs.resolve_checkpoint``) and refuse a checkpoint of
        another model.

        Lightning's own version merges the checkpoint's hyper-parameters into the config, over the user's
        overrides, and so silently switches models; here the config (with its overrides) is what runs and the
        checkpoint must fit it (its weights' shapes are checked once the model is built)."""
        sub = self.config.get('subcommand')
        cfg = self.config[sub] if sub else None
        ckpt = cfg.get('ckpt_path') if cfg is not None else None
        if not ckpt:
            return
        keyword = ckpt if ckpt in runs.KEYWORDS and not Path(ckpt).is_file() else None
        if keyword:
            cfg.ckpt_path = ckpt = str(runs.resolve_checkpoint(cfg.run_root, self._stem(cfg), keyword))
        elif not Path(ckpt).is_file():
            raise FileNotFoundError(f'--ckpt_path {ckpt}: no such file (or one of: {", ".join(runs.KEYWORDS)})')
        self._ckpt = read_checkpoint(ckpt)
        model_cfg = cfg.get('model')
        check_checkpoint_model(self._ckpt, ckpt, _init_args(model_cfg).get('name'),
                               model_cfg.get('class_path') if model_cfg is not None else None)
        if keyword:  # said once the checkpoint is known to fit (``_run``)
            where = 'mid-epoch' if Path(ckpt).name == 'interrupted.ckpt' else 'end of epoch'
            self._resolved = (f'--ckpt_path {keyword} is {ckpt} ({where} {self._ckpt.get("epoch")}, '
                              f'step {self._ckpt.get("global_step")})')

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand]
        model_cfg = cfg.get('model')
        stem = self._stem(cfg)
        name = _init_args(model_cfg).get('name')
        if isinstance(name, str) and not name.startswith('timm/'):  # close matches, before making a run folder
            import zoo
            zoo.model_info(name)
        self._user_sizes = {k: v for k, v in _init_args(model_cfg).items() if k in SIZES and v is not None}
        # One run folder for all processes of a DDP job: rank 0 makes it; the ranks torchrun or srun started
        # receive its path, the ranks Lightning launches itself inherit it.
        existed = [p for p in (Path(cfg.run_root) / stem, Path(cfg.run_root)) if p.exists()]
        inherited = os.environ.get(runs.RUN_DIR_ENV)
        launch = runs.external_launch()
        # Rank as the launcher gave it: srun sets SLURM_PROCID but no LOCAL_RANK, so only the cluster
        # environment tells rank 1 from rank 0 there; the ranks Lightning launches itself have LOCAL_RANK.
        self._rank0 = (launch.global_rank() if launch is not None else int(os.environ.get('LOCAL_RANK', '0'))) == 0
        if launch is not None:
            runs.check_world_size(cfg, launch)
            self.run_dir = runs.shared_run_dir(launch, lambda: runs.new_run_dir(cfg.run_root, stem),
                                               runs.pg_backend(cfg))
        elif inherited and int(os.environ.get('LOCAL_RANK', '0')) > 0:
            self.run_dir = Path(inherited)
        else:
            self.run_dir = runs.new_run_dir(cfg.run_root, stem)
            os.environ[runs.RUN_DIR_ENV] = str(self.run_dir)  # for the processes DDP launches only
            self.result.made = tuple(p for p in (self.run_dir, Path(cfg.run_root) / stem, Path(cfg.run_root))
                                     if p == self.run_dir or p not in existed)
        self.result.run_dir = self.run_dir

    def after_instantiate_classes(self) -> None:
        """Data of another task than the system's, and a size given on the command line that the data
        contradicts, are errors (before the run folder is written to), not a traceback or a silent replacement."""
        from .system import require_data_task
        require_data_task(self.model, self.datamodule)
        for k, v in self._user_sizes.items():
            data = getattr(self.datamodule, k, None)
            if data is not None and data != v:
                raise ValueError(f'--model.{k} {v} contradicts the data, which has {k}={data} (the data decides: '
                                 f'drop --model.{k} or change --data)')

    def instantiate_trainer(self, **kwargs):
        """The trainer with the run folder as its root, the default callbacks, a CSV logger in the run folder
        (unless the config turns loggers off), the loggers the config names (TensorBoard, MLflow, ... beside it)
        and the results-database logger."""
        from lightning.pytorch.callbacks import ModelSummary, ProgressBar
        from lightning.pytorch.loggers import CSVLogger

        from .recording import results_logger

        trainer_cfg = self.config[self.subcommand].trainer
        model = self.model
        extra = [cb for cb in default_callbacks(self.run_dir, *monitor_of(model), self.trial)
                 if not (trainer_cfg.get('enable_progress_bar') is False and isinstance(cb, ProgressBar))
                 and not (trainer_cfg.get('enable_model_summary') is False and isinstance(cb, ModelSummary))]
        if self.subcommand == 'predict' and hasattr(model, 'prediction_writer'):
            extra.append(model.prediction_writer(self.run_dir))
        if self.subcommand == 'test' and hasattr(model, 'test_writer'):  # a classifier's reliability diagram
            extra.append(model.test_writer(self.run_dir))
        self.trainer_defaults = {**self.trainer_defaults, 'callbacks': extra}
        configured = self.config_init[self.subcommand].trainer.get('logger')
        # the CSV logger first: Lightning takes the first logger's folder as ``trainer.log_dir``, where the resolved
        # config.yaml is saved, so the run folder keeps config.yaml and metrics.csv beside a user's tracker
        named = [] if configured in (None, True, False) else list(configured) if isinstance(configured, list) \
            else [configured]
        loggers = [] if configured is False else [CSVLogger(save_dir=str(self.run_dir), name='', version=''), *named]
        config = self.config[self.subcommand]
        resolved = json.loads(self.parser.dump(self.config, format='json', skip_none=False))[self.subcommand]
        self.results_logger = results_logger(
            config.get('db'), self.trial, config=resolved,
            recipe=','.join(_relative(getattr(f, 'relative', f)) for f in (config.get('config') or [])) or None)
        if self.results_logger is not None:
            loggers.append(self.results_logger)
        if trainer_cfg.get('default_root_dir') is None:
            kwargs.setdefault('default_root_dir', str(self.run_dir))
        return super().instantiate_trainer(logger=loggers or False, **kwargs)

    def _run(self, command: str, fn, **kwargs):
        """Run a trainer method: refuse a checkpoint whose weights do not fit the model first (nothing started,
        nothing written), then record the run in its manifest (``runs.py``) from start to end.

        Bad input found once the run has started but before its first training step (an optimizer refusing its
        learning rate, a check in ``setup`` or the first batch) leaves nothing either: no run folder, no results
        row, ``latest`` untouched (``_discard``). A run that trained keeps its folder and row, failed or not."""
        start_step = int(self._ckpt.get('global_step') or 0) if self._ckpt is not None else 0
        if self._ckpt is not None:
            check_weights_fit(self._ckpt, kwargs.get('ckpt_path'), self.model)
            self._ckpt = None  # the trainer reads the file itself
        rank0 = self._rank0 and self.run_dir is not None
        if rank0 and self._resolved:
            print(f'zoo {command}: {self._resolved}', file=sys.stderr)
        if rank0:
            runs.start_manifest(self.run_dir, command, kwargs.get('ckpt_path'))
        error = None
        try:
            return fn(**kwargs)
        except BaseException as e:
            error = e
            raise
        finally:
            if rank0:
                run_id = getattr(getattr(self, 'results_logger', None), 'run_id', None)
                if run_id is not None:  # the run's row in the results database: `zoo publish` reads its numbers
                    runs.write_manifest(self.run_dir, results_run_id=int(run_id))
                status = runs.finish_manifest(self.run_dir, error)
                if status == 'failed' and self._rejected(error, start_step):
                    self._discard()
                elif status == 'failed' and runs.wrote_nothing(self.run_dir):
                    runs.drop_manifest(self.run_dir)  # failed before writing anything: it leaves nothing behind
                # ``latest``: the newest fit that wrote a checkpoint and did not fail
                if command == 'fit' and status != 'failed' and runs.has_checkpoints(self.run_dir):
                    runs.point_latest(self.run_dir)

    def _rejected(self, error: BaseException, start_step: int) -> bool:
        """The run stopped on bad input (``usage_errors``) before it took a training step or saved a checkpoint.
        A sweep trial is never rejected here: the sweep records every trial, failed ones included."""
        return (isinstance(error, usage_errors()) and self.trial is None and self.trainer.global_step <= start_step
                and not runs.has_checkpoints(self.run_dir))

    def _discard(self) -> None:
        """Remove what a rejected run wrote: its files (``runs.discard_run``; ``run_cli`` then removes the empty
        folders it made) and its results-database row."""
        runs.discard_run(self.run_dir)
        if self.results_logger is not None:
            self.results_logger.discard()

    def fit(self, **kwargs) -> None:
        self._run('fit', self.trainer.fit, **kwargs)

    def validate(self, **kwargs) -> None:
        self._run('validate', self.trainer.validate, **kwargs)

    def test(self, **kwargs) -> None:
        """``zoo test``; with ``--corruptions`` the DataModule's test split is followed by one corrupted copy per
        (corruption, severity) (``ImageDataModule.test_corruptions``), and a ``--corruptions-reference`` run's
        errors make ``test_c/mce`` (``robustness.py``)."""
        if self.corruptions is not None:
            stem = self._stem(self.config[self.subcommand])
            if not hasattr(self.datamodule, 'test_corruptions') or not hasattr(self.model, 'corruption_reference'):
                raise ValueError(f'--corruptions is for image classification; {stem} runs '
                                 f'{type(self.model).__name__} on {type(self.datamodule).__name__}')
            pairs = tuple((c, s) for c in self.corruptions.names for s in self.corruptions.severities)
            if self.corruptions.reference is not None:
                from .robustness import reference_errors
                self.model.corruption_reference = reference_errors(self.corruptions.reference, pairs,
                                                                   db=self.config[self.subcommand].get('db'))
            else:
                print('zoo test: no --corruptions-reference, so no test_c/mce; test_c/ce is the unnormalised mean '
                      'corruption error (mean top-1 error over corruptions and severities)', file=sys.stderr)
            self.datamodule.test_corruptions = pairs
            kwargs['verbose'] = False  # Lightning's table per dataloader (dozens of them): one table of ours instead
        self._run('test', self.trainer.test, **kwargs)
        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items()}
        if self.corruptions is not None and self._rank0 and 'test_c/acc1' in metrics:
            from .robustness import corruption_table
            print(corruption_table(metrics))

    def predict(self, **kwargs) -> None:
        """``zoo predict``: the system's prediction writer (``prediction_writer``) writes into the run folder;
        with ``--images DIR`` the predict split is that folder's files, through the recipe's evaluation pipeline
        (``zoo.datasets.images``), checked before anything runs."""
        if self.images is not None:
            from zoo.datasets.images import predict_dataset

            from zoo import tasks

            task = getattr(self.model, 'task', None)
            if task in tasks.names() and tasks.get(task).takes_tokens:
                raise ValueError(f'--images is for image tasks; {self._stem(self.config[self.subcommand])} is a '
                                 f'language-modelling recipe')
            self.datamodule.predict_set = predict_dataset(self.datamodule, self.images)
        self._run('predict', self.trainer.predict, **kwargs)


def _relative(path) -> str:
    """A recipe path as the docs write it (relative to the working directory) when it lies below it."""
    p = os.path.abspath(str(path))
    cwd = os.getcwd()
    return os.path.relpath(p, cwd) if p.startswith(cwd + os.sep) else str(path)


def run_lightning_cli(argv: list[str], raise_errors: bool = False, images: str | None = None,
                      corruptions: Corruptions | None = None) -> int:
    """Run ``zoo <fit|validate|test|predict> ...``; return a process exit code (2 for bad input)."""
    return run_cli(argv, raise_errors=raise_errors, images=images, corruptions=corruptions).code


def run_cli(argv: list[str], raise_errors: bool = False, trial=None, images: str | None = None,
            corruptions: Corruptions | None = None) -> CLIRun:
    """Run ``zoo <fit|validate|test|predict> ...``: the exit code (2 for bad input) and the run folder.
    ``raise_errors``: raise a rejected configuration's error instead of printing it (``zoo sweep``
    stores it in the trial's run row). ``trial``: the sweep trial the run records itself under.
    ``images``: ``zoo predict --images DIR``'s folder. ``corruptions``: ``zoo test --corruptions``'."""
    argv = list(argv)
    command = argv[0] if argv else 'fit'
    try:
        argv = runs.resolve_configs(argv)
    except FileNotFoundError as e:
        if raise_errors:
            raise
        print(f'zoo {command}: error: {e}', file=sys.stderr)
        return CLIRun(2)
    result = CLIRun(0)
    try:
        with quiet_lightning():
            # exit_on_error=False: parse errors reach ZooCLI.parse_arguments, which makes them one line
            ZooCLI(model_class=LightningModule, datamodule_class=LightningDataModule, subclass_mode_model=True,
                   subclass_mode_data=True, args=argv, auto_configure_optimizers=False,
                   save_config_kwargs={'overwrite': False}, trial=trial, result=result, images=images,
                   corruptions=corruptions,
                   parser_kwargs={'prog': 'zoo', 'exit_on_error': False, 'allow_abbrev': False})
    except SystemExit as e:  # --help, --print_config
        result.code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except usage_errors() as e:
        runs.remove_if_empty(result.made)
        if raise_errors:
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        msg = str(msg) if isinstance(e, argparse.ArgumentError) else one_line_error(str(msg))  # parse: done already
        print(f'zoo {command}: error: {msg}', file=sys.stderr)
        result.code = 2
    return result


def check_arguments(argv: list[str]) -> None:
    """Parse ``zoo fit ...`` as the run would and build nothing (``--print_config``, its output dropped), so a
    bad argument is found before anything is written: raises the CLI's one-line error (close matches included)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run_cli([*argv, '--print_config'], raise_errors=True).code
    if code != 0:
        lines = err.getvalue().strip().splitlines()
        raise ValueError(f'zoo {argv[0]} rejected it: {lines[-1] if lines else f"exit code {code}"}')
