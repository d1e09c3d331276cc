"""``zoo fit|validate|test|predict``: LightningCLI over any Lightning system and DataModule.

    zoo fit -c recipes/configs/poolformer/poolformer_tiny_digits_15e.yaml
    zoo fit -c ... --model.name metaformer_tiny --model.model_args '{token_mixer: attention}' --trainer.max_epochs 3
    zoo fit -c ... --ckpt_path last          # resume the latest run of this config
    zoo test -c ... --ckpt_path best         # evaluate the best checkpoint of the latest run
    zoo predict -c ... --ckpt_path best      # the test split -> <run>/predictions.csv (id, label, score) and .pt
    zoo fit -c ... --print_config            # the resolved config

Model and data use LightningCLI's subclass form (``class_path`` + ``init_args``). Every run writes
a new folder ``<run_root>/<config stem>/<timestamp>/`` holding the resolved ``config.yaml``,
``checkpoints/`` (see ``checkpointing.py``) and ``metrics.csv``; an existing folder is never reused, and
``<stem>/latest`` points at the newest fit that wrote a checkpoint. ``num_classes``/``in_chans`` of the model default to the
DataModule's. A DDP job is one run: its processes share rank 0's folder, whether Lightning, ``torchrun`` or
``srun`` started them (``docs/cluster.md``).
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import logging
import os
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from lightning.pytorch import Callback, LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

from . import runs
from .checkpointing import check_checkpoint_model, check_weights_fit, checkpoint_callbacks, read_checkpoint


def default_callbacks(run_dir: str | Path | None = None, monitor: str = 'val/acc1', mode: str = 'max',
                      db: str | None = None, trial=None) -> list[Callback]:
    """The callbacks every run gets: progress bar, checkpoints (``checkpointing.py``), learning-rate monitor,
    and the results-database recorder (off with ``zoo fit --db none`` or ``ZOO_DB=none``); ``trial`` is the
    ``TrialContext`` of a sweep trial (its pruning callback joins the run)."""
    from lightning.pytorch.callbacks import LearningRateMonitor, TQDMProgressBar

    from .callbacks import EpochStats, results_callbacks

    ckpt_dir = str(Path(run_dir) / 'checkpoints') if run_dir is not None else None
    return [
        TQDMProgressBar(refresh_rate=10),
        model_summary(),
        *checkpoint_callbacks(ckpt_dir, monitor, mode),
        LearningRateMonitor(logging_interval='step'),
        EpochStats(),  # before the recorder, which stores each epoch's metrics at the same hook
        *results_callbacks(db, trial),
    ]


def model_summary() -> Callback:
    """Lightning's model summary without its FLOPs column and "Total FLOPs: 0": Lightning counts FLOPs only
    for a system with an ``example_input_array`` (ours take the input size from the data), so the 0 it
    printed was "not measured". Params and MACs of a model: ``zoo bench NAME``."""
    from lightning.pytorch.callbacks import ModelSummary, RichModelSummary
    from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

    base = RichModelSummary if _RICH_AVAILABLE else ModelSummary

    class ZooModelSummary(base):
        @staticmethod
        def summarize(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                      total_flops, **kwargs) -> None:
            if total_flops:  # measured: Lightning's own table
                return base.summarize(summary_data, total_parameters, trainable_parameters, model_size,
                                      total_training_modes, total_flops, **kwargs)
            from lightning.pytorch.utilities.model_summary.model_summary import (get_formatted_model_size,
                                                                                get_human_readable_count)
            columns = [(name, values) for name, values in summary_data if name != 'FLOPs']
            widths = [max(len(name), *(len(v) for v in values)) if values else len(name) for name, values in columns]
            lines = ['  '.join(name.ljust(w) for (name, _), w in zip(columns, widths))]
            lines += ['  '.join(v.ljust(w) for v, w in zip(row, widths)) for row in zip(*(v for _, v in columns))]
            lines.append(f'params: {get_human_readable_count(int(total_parameters)).strip()} '
                         f'({get_human_readable_count(int(total_parameters - trainable_parameters)).strip()} frozen), '
                         f'{get_formatted_model_size(model_size)} MB; modules in train mode: '
                         f"{total_training_modes['train']}, in eval mode: {total_training_modes['eval']}")
            print('\n'.join(lines))

    return ZooModelSummary()


def _import(class_path: str):
    module, _, name = class_path.rpartition('.')
    return getattr(importlib.import_module(module), name)


def _init_args(ns) -> dict:
    args = ns.get('init_args') if ns is not None else None
    return dict(args.as_dict() if hasattr(args, 'as_dict') else (args or {}))


@dataclass
class CLIRun:
    """What one ``zoo fit|validate|test|predict`` returns: its exit code and its run folder."""
    code: int
    run_dir: Path | None = None
    made: tuple[Path, ...] = ()  # folders this run created, innermost first (removed again if it is rejected)


class ZooCLI(LightningCLI):
    """LightningCLI with run folders, the default callbacks and data-derived model sizes.

    ``trial``: the sweep trial this run belongs to (``recipes.callbacks.TrialContext``), passed in by
    ``zoo sweep``; ``--db`` is a parsed argument (the results database of this run)."""

    def __init__(self, *args, trial=None, result: CLIRun | None = None, **kwargs):
        self.trial, self.result, self.run_dir = trial, result or CLIRun(0), None
        super().__init__(*args, **kwargs)

    def parse_arguments(self, parser, args) -> None:
        """jsonargparse's errors (usage plus a nested Union report) as one line with close matches."""
        try:
            super().parse_arguments(parser, args)
        except argparse.ArgumentError as e:
            sub = next((a for a in (args or []) if a in self.subcommands()), None) if isinstance(args, list) else None
            raise argparse.ArgumentError(None, one_line_error(str(e), _subcommand_parser(parser, sub))) from None

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument('--run_root', default=os.environ.get('ZOO_RUNS', 'runs'),
                            help='runs are written to <run_root>/<config stem>/<timestamp>/ (env ZOO_RUNS)')
        parser.add_argument('--db', type=Optional[str], default=None,
                            help="results database of this run: a path, a SQLAlchemy URL or 'none' "
                                 "(default $ZOO_DB or ./zoo-results.db)")
        parser.add_argument('--seeds', type=Optional[str], default=None,
                            help="'0,1,2': one run per seed, recorded as repeats of one configuration "
                                 '(handled by `zoo`, before this parser)')

    @staticmethod
    def _stem(cfg) -> str:
        configs = [c for c in (cfg.get('config') or []) if c]
        return Path(str(configs[-1])).stem if configs else str(_init_args(cfg.get('model')).get('name') or 'run')

    def _parse_ckpt_path(self) -> None:
        """Resolve ``--ckpt_path last|best|interrupted`` (``runs.resolve_checkpoint``), say which run and epoch it
        is, and refuse a checkpoint of another model.

        Lightning's own version merges the checkpoint's hyper-parameters into the config, over the user's
        overrides, and so silently switches models; here the config (with its overrides) is what runs and the
        checkpoint must fit it (its weights' shapes are checked once the model is built)."""
        self._ckpt = self._resolved = None
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
        self.run_stem = stem
        self._check_model_name(model_cfg)  # before making a run folder
        # One run folder for all processes of a DDP job: rank 0 makes it; the ranks torchrun or srun started
        # receive its path, the ranks Lightning launches itself inherit it.
        existed = [p for p in (Path(cfg.run_root) / stem, Path(cfg.run_root)) if p.exists()]
        inherited = os.environ.get(runs.RUN_DIR_ENV)
        launch = runs.external_launch()
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
        self._fill_sizes_from_data(cfg)

    @staticmethod
    def _check_model_name(model_cfg) -> None:
        """An unknown ``--model.name`` fails here with the registry's close matches, not deep in instantiation."""
        name = _init_args(model_cfg).get('name')
        if isinstance(name, str) and not name.startswith('timm/'):
            import zoo
            zoo.model_info(name)  # KeyError naming close matches

    @staticmethod
    def _fill_sizes_from_data(cfg) -> None:
        """Default the model's ``num_classes``/``in_chans``/``vocab_size``/``img_size`` to the DataModule's, when
        the system takes them."""
        model_cfg, data_cfg = cfg.get('model'), cfg.get('data')
        if model_cfg is None or data_cfg is None or not model_cfg.get('class_path') or not data_cfg.get('class_path'):
            return
        params = inspect.signature(_import(model_cfg.class_path)).parameters
        wanted = [k for k in ('num_classes', 'in_chans', 'vocab_size', 'img_size')
                  if k in params and model_cfg.init_args.get(k) is None]
        if not wanted:
            return
        data = _import(data_cfg.class_path)(**_init_args(data_cfg))
        for k in wanted:
            if getattr(data, k, None) is not None:
                model_cfg.init_args[k] = getattr(data, k)

    def _run(self, command: str, fn, **kwargs):
        """Run a trainer method: refuse a checkpoint whose weights do not fit the model first (nothing started,
        nothing written), then record the run in its manifest (``runs.py``) from start to end."""
        if self._ckpt is not None:
            check_weights_fit(self._ckpt, kwargs.get('ckpt_path'), self.model)
            self._ckpt = None  # the trainer reads the file itself
        rank0 = int(os.environ.get('LOCAL_RANK', '0')) == 0 and self.run_dir is not None
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
                status = runs.finish_manifest(self.run_dir, error)
                if status == 'failed' and runs.wrote_nothing(self.run_dir):
                    runs.drop_manifest(self.run_dir)  # failed before writing anything: it leaves nothing behind
                # ``latest``: the newest fit that wrote a checkpoint and did not fail
                if command == 'fit' and status != 'failed' and runs.has_checkpoints(self.run_dir):
                    runs.point_latest(self.run_dir)

    def fit(self, **kwargs) -> None:
        self._run('fit', self.trainer.fit, **kwargs)

    def validate(self, **kwargs) -> None:
        self._run('validate', self.trainer.validate, **kwargs)

    def test(self, **kwargs) -> None:
        self._run('test', self.trainer.test, **kwargs)

    def predict(self, **kwargs) -> None:
        """``zoo predict``: the system's ``predict_step`` outputs, concatenated, saved as ``predictions.pt``;
        for class probabilities also ``predictions.csv`` (sample id in the predict split, label, score)."""
        import torch

        outputs = self._run('predict', self.trainer.predict, **{**kwargs, 'return_predictions': True})
        if outputs and isinstance(outputs[0], list):  # several dataloaders: keep the first
            outputs = outputs[0]
        writer = getattr(self.model, 'write_predictions', None)  # a system that writes its own (detection)
        if outputs and writer is not None and self.trainer.is_global_zero:
            writer(outputs, self.run_dir)
            return
        if outputs and all(isinstance(o, torch.Tensor) for o in outputs):
            rank = f'-rank{self.trainer.global_rank}' if self.trainer.world_size > 1 else ''
            probs = torch.cat(outputs)
            torch.save(probs, self.run_dir / f'predictions{rank}.pt')
            written = [self.run_dir / f'predictions{rank}.pt']
            if probs.ndim == 2:  # (N, classes): a table a person can read
                score, label = probs.float().max(dim=1)
                lines = ['id,label,score'] + [f'{i},{int(c)},{float(p):.6f}' for i, (c, p) in enumerate(zip(label, score))]
                written.append(self.run_dir / f'predictions{rank}.csv')
                written[-1].write_text('\n'.join(lines) + '\n')
            print(f'zoo predict: {len(probs)} predictions saved to {", ".join(map(str, written))}')

    def instantiate_trainer(self, **kwargs):
        from lightning.pytorch.callbacks import ModelSummary, ProgressBar
        from lightning.pytorch.loggers import CSVLogger

        trainer_cfg = {**self._get(self.config_init, 'trainer', default={}), **kwargs}
        if trainer_cfg.get('logger') in (None, True):
            trainer_cfg['logger'] = CSVLogger(save_dir=str(self.run_dir), name='', version='')
        if trainer_cfg.get('default_root_dir') is None:
            trainer_cfg['default_root_dir'] = str(self.run_dir)
        model = self._get(self.config_init, 'model')
        extra = [self._get(self.config_init, c) for c in self._parser(self.subcommand).callback_keys]
        db = self.config[self.subcommand].get('db')
        extra += [cb for cb in default_callbacks(self.run_dir, monitor=getattr(model, 'monitor', 'val/acc1'),
                                                 mode=getattr(model, 'monitor_mode', 'max'), db=db, trial=self.trial)
                  if not (trainer_cfg.get('enable_progress_bar') is False and isinstance(cb, ProgressBar))
                  and not (trainer_cfg.get('enable_model_summary') is False and isinstance(cb, ModelSummary))]
        return self._instantiate_trainer(trainer_cfg, extra)


# jsonargparse's report around the reason: which Union members were tried, the value's repr, ...
_BOILERPLATE = re.compile(r"^(- )?(Parser key |Does not validate against any of the Union subtypes|Subtypes: |Errors:"
                          r"|Given value type: |Given value: |Expected a <class 'NoneType'>|Problem with given class_path"
                          r"|Expected a path but )")


def _subcommand_parser(parser, sub: str | None):
    action = getattr(parser, '_subcommands_action', None)
    return action._name_parser_map.get(sub, parser) if action is not None and sub else parser


def _option_names(parser) -> list[str]:
    return [o for a in getattr(parser, '_actions', []) for o in a.option_strings if o.startswith('--')]


def _close(word: str, choices, n: int = 3) -> str:
    found = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.6)
    return f"; did you mean {' or '.join(found)}?" if found else ''


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
        return f'{what}{_close(option, _option_names(parser))} (`{prog} --help` lists the options)'
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
        return (f'{option}.{arg}: {class_path[-1]} takes no argument {arg!r}{_close(arg, accepted)}'
                + (f" (it takes: {', '.join(accepted)})" if accepted and not _close(arg, accepted) else ''))
    missing = re.match(r"module '([\w.]+)' has no attribute '(\w+)'", reason)
    if missing:
        try:
            names = dir(importlib.import_module(missing.group(1)))
        except Exception:
            names = []
        return f'{option}: no class {missing.group(2)} in {missing.group(1)}{_close(missing.group(2), names)}'
    typed = re.match(r'Expected an? (\w+)', reason)
    if typed and given:
        return f'{option} expects {typed.group(1)}, got {given[0]}'
    return f'{option}: {reason}' if option else reason


def _usage_errors() -> tuple[type[Exception], ...]:
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    return (KeyError, ValueError, TypeError, FileNotFoundError, FloatingPointError, ImportError,
            MisconfigurationException, argparse.ArgumentError)


def run_lightning_cli(argv: list[str], raise_errors: bool = False) -> int:
    """Run ``zoo <fit|validate|test|predict> ...``; return a process exit code (2 for bad input)."""
    return run_cli(argv, raise_errors=raise_errors).code


def run_cli(argv: list[str], raise_errors: bool = False, trial=None) -> CLIRun:
    """Run ``zoo <fit|validate|test|predict> ...``: the exit code (2 for bad input) and the run folder.
    ``raise_errors``: raise a rejected configuration's error instead of printing it (``zoo sweep``
    stores it in the trial's run row). ``trial``: the sweep trial the run records itself under."""
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
    _quiet_lightning_logs()
    try:
        with warnings.catch_warnings():
            for message in _NOISE:
                warnings.filterwarnings('ignore', message=message)
            # exit_on_error=False: parse errors reach ZooCLI.parse_arguments, which makes them one line
            ZooCLI(model_class=LightningModule, datamodule_class=LightningDataModule, subclass_mode_model=True,
                   subclass_mode_data=True, args=argv, auto_configure_optimizers=False,
                   save_config_kwargs={'overwrite': False}, trial=trial, result=result,
                   parser_kwargs={'prog': 'zoo', 'exit_on_error': False, 'allow_abbrev': False})
    except SystemExit as e:  # --help, --print_config
        result.code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except _usage_errors() as e:
        runs.remove_if_empty(result.made)
        if raise_errors:
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        msg = str(msg) if isinstance(e, argparse.ArgumentError) else one_line_error(str(msg))  # parse: done already
        print(f'zoo {command}: error: {msg}', file=sys.stderr)
        result.code = 2
    return result


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


def _quiet_lightning_logs() -> None:
    for name in ('lightning.pytorch.utilities.rank_zero', 'lightning.fabric.utilities.rank_zero',
                 'lightning.fabric.utilities.seed'):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLightningTips) for f in logger.filters):
            logger.addFilter(_DropLightningTips())
