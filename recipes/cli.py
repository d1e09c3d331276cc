"""``zoo fit|validate|test|predict``: LightningCLI over any Lightning system and DataModule.

    zoo fit -c recipes/configs/poolformer/poolformer_tiny_digits_15e.yaml
    zoo fit -c ... --model.name metaformer_tiny --model.model_args '{token_mixer: attention}' --trainer.max_epochs 3
    zoo fit -c ... --ckpt_path last          # resume the latest run of this config
    zoo test -c ... --ckpt_path best         # evaluate the best checkpoint of the latest run
    zoo predict -c ... --ckpt_path best      # class probabilities of the test split -> <run>/predictions.pt
    zoo fit -c ... --print_config            # the resolved config

Model and data use LightningCLI's subclass form (``class_path`` + ``init_args``). Every run writes
a new folder ``<run_root>/<config stem>/<timestamp>/`` holding the resolved ``config.yaml``,
``checkpoints/`` (``last.ckpt`` and the best on the system's ``monitor``) and ``metrics.csv``; an
existing folder is never reused. ``num_classes``/``in_chans`` of the model default to the
DataModule's.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
import warnings
from datetime import datetime, timezone
from pathlib import Path

from lightning.pytorch import Callback, LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

_RUN_DIR_ENV = 'ZOO_RUN_DIR'  # rank 0's run folder, inherited by the processes DDP launches


def _checkpoint_class():
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Checkpoint(ModelCheckpoint):
        """ModelCheckpoint with its ``state_key`` computed once: Lightning names every hook call by it,
        and ModelCheckpoint rebuilds it from its settings each time (about 0.3 ms per training step)."""

        @property
        def state_key(self) -> str:
            if '_zoo_state_key' not in self.__dict__:
                self.__dict__['_zoo_state_key'] = super().state_key
            return self.__dict__['_zoo_state_key']

    return Checkpoint


def default_callbacks(run_dir: str | Path | None = None, monitor: str = 'val/acc1', mode: str = 'max') -> list[Callback]:
    """The callbacks every run gets: progress bar, last + best checkpoints, learning-rate monitor, and the
    results-database recorder (off with ``zoo fit --db none`` or ``ZOO_DB=none``)."""
    from lightning.pytorch.callbacks import LearningRateMonitor, TQDMProgressBar

    from .callbacks import results_callbacks

    ckpt_dir = str(Path(run_dir) / 'checkpoints') if run_dir is not None else None
    return [
        TQDMProgressBar(refresh_rate=10),
        _checkpoint_class()(dirpath=ckpt_dir, filename='best-epoch{epoch}-step{step}', auto_insert_metric_name=False,
                            monitor=monitor, mode=mode, save_top_k=1, save_last=True),
        LearningRateMonitor(logging_interval='step'),
        *results_callbacks(),
    ]


def _import(class_path: str):
    module, _, name = class_path.rpartition('.')
    return getattr(importlib.import_module(module), name)


def _init_args(ns) -> dict:
    args = ns.get('init_args') if ns is not None else None
    return dict(args.as_dict() if hasattr(args, 'as_dict') else (args or {}))


def new_run_dir(root: str | Path, stem: str) -> Path:
    """``root/stem/<UTC timestamp>``, made here; a suffix keeps two runs in one second apart."""
    base = Path(root) / stem
    stamp = datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')
    for i in range(1000):
        path = base / (stamp if i == 0 else f'{stamp}-{i}')
        try:
            path.mkdir(parents=True, exist_ok=False)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f'could not create a new run folder under {base}')


def find_checkpoint(root: str | Path, stem: str, which: str) -> Path:
    """``last.ckpt`` (or the best checkpoint) of the latest run of ``stem`` that has one."""
    base = Path(root) / stem
    runs = sorted((p for p in base.glob('*') if p.is_dir() and not p.is_symlink()), reverse=True) if base.is_dir() else []
    for run in runs:
        ckpts = [run / 'checkpoints' / 'last.ckpt'] if which == 'last' else sorted(run.glob('checkpoints/best-*.ckpt'))
        ckpts = [c for c in ckpts if c.is_file()]
        if ckpts:
            return ckpts[-1]
    raise FileNotFoundError(f"--ckpt_path {which}: no run of {stem!r} with a {which} checkpoint under {base} "
                            f"(runs are written by `zoo fit -c <config>`; pass a checkpoint file instead)")


def _point_latest(run_dir: Path) -> None:
    """Keep ``<run_root>/<stem>/latest`` pointing at the newest run (configs can name its checkpoints)."""
    link = run_dir.parent / 'latest'
    try:
        if link.is_symlink():
            link.unlink()
        if not link.exists():
            link.symlink_to(run_dir.name, target_is_directory=True)
    except OSError:  # file systems without symlinks: the timestamped folders are enough
        pass


class ZooCLI(LightningCLI):
    """LightningCLI with run folders, the default callbacks and data-derived model sizes."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument('--run_root', default=os.environ.get('ZOO_RUNS', 'runs'),
                            help='runs are written to <run_root>/<config stem>/<timestamp>/ (env ZOO_RUNS)')

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand]
        configs = [c for c in (cfg.get('config') or []) if c]
        model_cfg = cfg.get('model')
        stem = Path(str(configs[-1])).stem if configs else str(_init_args(model_cfg).get('name') or 'run')
        self.run_stem = stem
        self._check_model_name(model_cfg)  # before making a run folder
        # One run folder for all processes of a DDP job: rank 0 makes it, the ranks it launches inherit it.
        inherited = os.environ.get(_RUN_DIR_ENV)
        if inherited and int(os.environ.get('LOCAL_RANK', '0')) > 0:
            self.run_dir = Path(inherited)
        else:
            self.run_dir = new_run_dir(cfg.run_root, stem)
            os.environ[_RUN_DIR_ENV] = str(self.run_dir)
            _point_latest(self.run_dir)
        ckpt = cfg.get('ckpt_path')
        if ckpt in ('last', 'best') and not Path(ckpt).is_file():
            cfg.ckpt_path = str(find_checkpoint(cfg.run_root, stem, ckpt))
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
        """Default the model's ``num_classes``/``in_chans`` to the DataModule's, when the system takes them."""
        model_cfg, data_cfg = cfg.get('model'), cfg.get('data')
        if model_cfg is None or data_cfg is None or not model_cfg.get('class_path') or not data_cfg.get('class_path'):
            return
        params = inspect.signature(_import(model_cfg.class_path)).parameters
        wanted = [k for k in ('num_classes', 'in_chans')
                  if k in params and model_cfg.init_args.get(k) is None]
        if not wanted:
            return
        data = _import(data_cfg.class_path)(**_init_args(data_cfg))
        for k in wanted:
            if getattr(data, k, None) is not None:
                model_cfg.init_args[k] = getattr(data, k)

    def predict(self, **kwargs) -> None:
        """``zoo predict``: the system's ``predict_step`` outputs, concatenated, saved as ``predictions.pt``."""
        import torch

        outputs = self.trainer.predict(**{**kwargs, 'return_predictions': True})
        if outputs and isinstance(outputs[0], list):  # several dataloaders: keep the first
            outputs = outputs[0]
        writer = getattr(self.model, 'write_predictions', None)  # a system that writes its own (detection)
        if outputs and writer is not None and self.trainer.is_global_zero:
            writer(outputs, self.run_dir)
            return
        if outputs and all(isinstance(o, torch.Tensor) for o in outputs):
            path = self.run_dir / (f'predictions-rank{self.trainer.global_rank}.pt' if self.trainer.world_size > 1
                                   else 'predictions.pt')
            torch.save(torch.cat(outputs), path)
            print(f'zoo predict: {sum(len(o) for o in outputs)} predictions saved to {path}')

    def instantiate_trainer(self, **kwargs):
        from lightning.pytorch.callbacks import ProgressBar
        from lightning.pytorch.loggers import CSVLogger

        trainer_cfg = {**self._get(self.config_init, 'trainer', default={}), **kwargs}
        if trainer_cfg.get('logger') in (None, True):
            trainer_cfg['logger'] = CSVLogger(save_dir=str(self.run_dir), name='', version='')
        if trainer_cfg.get('default_root_dir') is None:
            trainer_cfg['default_root_dir'] = str(self.run_dir)
        model = self._get(self.config_init, 'model')
        extra = [self._get(self.config_init, c) for c in self._parser(self.subcommand).callback_keys]
        extra += [cb for cb in default_callbacks(self.run_dir, monitor=getattr(model, 'monitor', 'val/acc1'),
                                                 mode=getattr(model, 'monitor_mode', 'max'))
                  if not (trainer_cfg.get('enable_progress_bar') is False and isinstance(cb, ProgressBar))]
        return self._instantiate_trainer(trainer_cfg, extra)


def _usage_errors() -> tuple[type[Exception], ...]:
    from lightning.fabric.utilities.exceptions import MisconfigurationException
    return (KeyError, ValueError, TypeError, FileNotFoundError, FloatingPointError, ImportError,
            MisconfigurationException)


def _check_config_paths(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        path = argv[i + 1] if arg in ('-c', '--config') and i + 1 < len(argv) else (
            arg.split('=', 1)[1] if arg.startswith('--config=') else None)
        if path is not None and not path.lstrip().startswith(('{', '[')) and not Path(path).is_file():
            here = Path(__file__).parent / 'configs'
            found = sorted(str(p.relative_to(here.parent.parent)) for p in here.glob('**/*.yaml'))
            return (f'config file not found: {path}. Recipes live in recipes/configs/<family>/; available: '
                    + (', '.join(found) if found else 'none'))
    return None


def run_lightning_cli(argv: list[str], raise_errors: bool = False) -> int:
    """Run ``zoo <fit|validate|test|predict> ...``; return a process exit code (2 for bad input).
    ``raise_errors``: raise a rejected configuration's error instead of printing it (``zoo sweep``
    stores it in the trial's run row)."""
    argv = list(argv)
    command = argv[0] if argv else 'fit'
    problem = _check_config_paths(argv)
    if problem:
        print(f'zoo {command}: error: {problem}', file=sys.stderr)
        return 2
    try:
        with warnings.catch_warnings():  # `python -m zoo.cli fit ...` passes sys.argv on purpose
            warnings.filterwarnings('ignore', message=".*args parameter is intended")
            warnings.filterwarnings('ignore', message=".*litlogger")
            ZooCLI(model_class=LightningModule, datamodule_class=LightningDataModule, subclass_mode_model=True,
                   subclass_mode_data=True, args=argv, auto_configure_optimizers=False,
                   save_config_kwargs={'overwrite': False},
                   parser_kwargs={'prog': 'zoo', **({'exit_on_error': False} if raise_errors else {})})
    except SystemExit as e:  # argparse/jsonargparse: --help, --print_config, or a parse error already printed
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except _usage_errors() as e:
        if raise_errors:
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f'zoo {command}: error: {msg}', file=sys.stderr)
        return 2
    return 0
