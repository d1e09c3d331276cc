"""``ZooSystem``: the plumbing every task's Lightning system shares, so each task keeps only its step logic.

A system receives a model *name* and its arguments and builds the network from the registry (Lightning's
system/model split: it never defines architecture). The base owns:

- building the model (``zoo.create_with_optional``): the sizes the data knows (``num_classes``, ``in_chans``,
  ``img_size``, ``vocab_size``; ``zoo fit`` links them from the DataModule) reach the models that take them;
- the task checks (a classifier's name given to the detection system is a one-line error, and so is a
  DataModule of another task: ``require_data_task``, which ``zoo fit`` calls once both are built);
- an EMA of the weights (timm's ``ModelEmaV3``; ``eval_model`` is what validation, test and predict run);
- parameter groups (``optim.param_groups``: no weight decay on norms, biases and ``no_weight_decay()``) given
  to an injected optimizer and scheduler (LightningCLI's ``OptimizerCallable`` / ``LRSchedulerCallable``:
  ``optimizer: {class_path: torch.optim.AdamW, init_args: {lr: 0.002}}`` in a config);
- one non-finite loss guard without per-step host syncs;
- the train loss logged on the steps the logger writes only (``self.log`` costs ~2 ms of Python a call);
- what the results database records: ``model_name``, ``task``, ``block_choices``, ``network`` (the spec
  ``zoo bench`` rebuilds the network from), ``monitor`` (the task's primary metric).

A task's system sets ``task`` (a ``zoo.tasks`` name: its metric, direction, input spec and writer come from
there) and writes ``training_step`` (returning the loss), its evaluation and its prediction; see
``classification.py``, ``lm.py``, ``denoising.py``, and ``dense.py`` (``DenseSystem``, the base of ``detection.py``
and ``segmentation.py``).
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn

import zoo
from zoo import tasks
from zoo._runtime import check_runtime

from . import optim

__all__ = ['ZooSystem', 'require_task', 'require_data_task', 'block_choices']

# model_args keys that choose a block: recorded as ``block_choices`` by the results database.
_BLOCK_KEYS = ('token_mixer', 'canon', 'mixer', 'backbone', 'neck', 'head')


def require_task(name: str, task: str, system: str) -> None:
    """A one-line error when the registered model ``name`` is not a ``task`` model (close choices listed)."""
    if name.startswith('timm/'):
        return
    info = zoo.model_info(name)
    if info.task != task:
        theirs = tasks.get(info.task).system  # where the model's own task is trained (its registered system)
        raise ValueError(f'{name} is a {info.task} model; {system} trains task="{task}" models '
                         f'({", ".join(zoo.list_models(task=task))})'
                         + (f'; train {name} with {theirs}' if theirs else ''))


def require_data_task(system, datamodule) -> None:
    """A one-line error when ``datamodule`` serves another task than ``system`` trains (their ``zoo_task`` and
    ``task``), naming the DataModules of the system's task. Data of another task would otherwise fail deep in the
    first training step (a detection loss indexing a segmentation mask). A DataModule without ``zoo_task`` (a
    user's own) is not checked."""
    task, data_task = getattr(system, 'task', ''), getattr(datamodule, 'zoo_task', None)
    if not task or not data_task or data_task == task:
        return
    import zoo.datasets
    ours = {n: getattr(zoo.datasets, n) for n in zoo.datasets.__all__ if n.endswith('DataModule')}
    fitting = [f'zoo.datasets.{n}' for n, cls in ours.items() if getattr(cls, 'zoo_task', None) == task
               and not any(o is not cls and issubclass(o, cls) for o in ours.values())]  # not a base of others
    raise ValueError(f'the {task} system needs a {task} DataModule; {type(datamodule).__name__} is a {data_task} one'
                     + (f' (--data {" or ".join(fitting)})' if fitting else ''))


def block_choices(model_args: dict | None) -> dict:
    """The block-selecting entries of ``model_args`` (``token_mixer``, ``backbone``, ``*_layer``, ``*_mixer``, ...)
    and of its ``backbone_kwargs``, as strings."""
    out = {}
    args = dict(model_args or {})
    for k, v in {**dict(args.get('backbone_kwargs') or {}), **args}.items():
        if k in _BLOCK_KEYS or k.endswith(('_layer', '_mixer', '_mode')):
            out[k] = v if isinstance(v, str) else str(list(v) if isinstance(v, tuple) else v)
    return out


class ZooSystem(LightningModule):
    """The shared plumbing of every task's system (see the module docstring).

    Args:
        name: a registered model of this system's task (``zoo list --task T``; ``timm/<name>`` for classifiers).
        model_args: more arguments for ``zoo.create`` (``{'token_mixer': 'attention'}``).
        checkpoint: weights to start from (a state dict or a ``zoo fit`` checkpoint, whose evaluated weights, the EMA
            when that run kept one, are taken: ``zoo.create``, ``zoo.read_weights``).
        num_classes, in_chans, img_size, vocab_size: the sizes the data knows (``zoo fit`` links them from the
            DataModule); each reaches the model only if it takes that argument.
        optimizer: called with the parameter groups (default AdamW, lr 1e-3, weight decay 0.05).
        lr_scheduler: called with the optimizer (default ``optim.WarmupCosine``: cosine to 0 over the run, per
            step, sized from the run; ``None``: a constant learning rate).
        ema_decay: keep an EMA of the weights with this decay (e.g. 0.9999) and evaluate it.
        compile: ``torch.compile`` the network's forward in place (``nn.Module.compile``, so checkpoints keep their
            keys), in ``configure_model`` (Lightning has no compile flag): ``zoo fit --compile``. ``True`` is
            inductor; a string names another torch.compile backend (``'eager'``: graph capture only). Detection
            and segmentation models compile their backbone, neck and head (``DenseModel.compile``), so the
            ``forward_raw`` their training calls runs compiled too; the loss stays eager.
        channels_last: keep the network's 4-D weights in channels-last memory format (timm's
            ``--channels-last``): a convolution with channels-last weights gives channels-last maps whatever its
            input's layout, so oneDNN's CPU convolutions run without layout reorders. On the AMD
            EPYC CPU the ``semfpn_resnet18h_shapes_seg`` training step is 1.25x faster in float32 and 1.9x with
            ``--trainer.precision bf16-mixed`` (docs/segmentation.md).
        runtime: what runs the network in ``zoo test`` (``zoo.RUNTIMES``): ``onnxruntime`` (or ``openvino``,
            ``compile``) evaluates ``zoo.optimize(network, runtime)`` (the exported graph) through the same test
            loop, and the results database records the run's runtime beside the eager one.
        grad_checkpointing: timm's ``set_grad_checkpointing()`` on the model: each block's activations are
            recomputed in the backward pass instead of stored (less memory, more compute; PIIP's official detection
            configs train this way).
    """

    task = ''           # the registry task this system trains
    ema_warmup = False  # timm's warm-up of the EMA decay (YOLO-style detection uses it)

    def __init__(self, name: str, model_args: Optional[dict] = None, checkpoint: Optional[str] = None,
                 num_classes: Optional[int] = None, in_chans: Optional[int] = None, img_size: Optional[int] = None,
                 vocab_size: Optional[int] = None,
                 optimizer: OptimizerCallable = lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05),
                 lr_scheduler: Optional[LRSchedulerCallable] = lambda opt: optim.WarmupCosine(opt),
                 ema_decay: Optional[float] = None, compile: Union[bool, str] = False, runtime: str = 'eager',
                 grad_checkpointing: bool = False, channels_last: bool = False):
        super().__init__()
        require_task(name, self.task, type(self).__name__)
        check_runtime(runtime, 'runtime {runtime!r} is not one of {runtimes}')
        self._runtime_model = None
        self.save_hyperparameters(ignore=['optimizer', 'lr_scheduler'])
        self.optimizer_factory, self.scheduler_factory = optimizer, lr_scheduler
        self.model_name = name
        self.model_args = dict(model_args or {})
        self.sizes = {k: v for k, v in dict(num_classes=num_classes, in_chans=in_chans, img_size=img_size,
                                             vocab_size=vocab_size).items() if v is not None}
        self.model = self.build_model()
        if grad_checkpointing:
            if not hasattr(self.model, 'set_grad_checkpointing'):
                raise ValueError(f'{name} has no set_grad_checkpointing (timm\'s switch); drop grad_checkpointing')
            self.model.set_grad_checkpointing()
        if channels_last:  # before the EMA copy is made, so evaluation runs channels-last too
            self.model.to(memory_format=torch.channels_last)
        self.block_choices = block_choices(self.model_args)
        if getattr(self.model, 'backbone_name', None):
            self.block_choices['backbone'] = self.model.backbone_name
        self.ema = None
        if ema_decay is not None:
            from timm.utils import ModelEmaV3
            self.ema = ModelEmaV3(self.model, decay=ema_decay, use_warmup=self.ema_warmup)
        self._nonfinite = None  # device flag: a non-finite training loss was seen (checked without per-step syncs)

    # -- the network -------------------------------------------------------------------------------------------
    def configure_model(self) -> None:
        """``compile=True``: compile the network (and its EMA copy, which evaluation runs) once, in place."""
        how = self.hparams.get('compile')
        if how and not getattr(self, '_network_compiled', False):  # fit then test call this twice
            kw = {} if how is True else {'backend': str(how)}
            self.model.compile(**kw)
            if self.ema is not None:
                self.ema.module.compile(**kw)
            self._network_compiled = True

    def build_model(self) -> nn.Module:
        return zoo.create_with_optional(self.model_name, self.sizes, checkpoint=self.hparams.checkpoint,
                                        **self.model_args)

    @property
    def network(self) -> dict:
        """The spec ``zoo bench`` rebuilds this run's network from: ``zoo.create(name, **kwargs)``, then
        ``zoo.layers.convbn.set_mode(model, convbn_mode)`` for a system that switched its Conv+BN pairs."""
        spec = {'name': self.model_name, 'kwargs': dict(getattr(self.model, 'zoo_args', self.model_args))}
        if self.hparams.get('convbn_mode') is not None:
            spec['convbn_mode'] = self.hparams.convbn_mode
        return spec

    @property
    def monitor(self) -> str:
        """The task's primary metric: what "best" checkpoints and leaderboards rank by."""
        return tasks.get(self.task).metric

    @property
    def monitor_mode(self) -> str:
        """The primary metric's direction, from the task: 'max' (accuracy, mAP, PSNR) or 'min' (an error such as
        RMSE); the best checkpoint is kept by it."""
        return tasks.get(self.task).mode

    @property
    def eval_model(self) -> nn.Module:
        """The EMA of the weights when there is one, else the model: what evaluation and prediction run (in
        ``zoo test --runtime R``, that network in runtime R)."""
        if self._runtime_model is not None:
            return self._runtime_model
        return self.ema.module if self.ema is not None else self.model

    def on_test_start(self) -> None:
        """``runtime`` other than eager: the evaluated network (its checkpoint weights are loaded by now) is
        captured once for the test loop, traced on a batch of the data's input size."""
        if self.hparams.get('runtime', 'eager') == 'eager':
            return
        import copy

        net = copy.deepcopy(self.eval_model).cpu().eval()
        # the data's sizes: an exported graph has one image size and one token length, the data's
        size = tasks.input_size(self.model_name, img_size=self.sizes.get('img_size'),
                                in_chans=self.sizes.get('in_chans'),
                                context_length=getattr(self.trainer.datamodule, 'context_length', None))
        x = tasks.example_input(net, size, 2, self.task)
        self._runtime_model = zoo.optimize(net, self.hparams.runtime, x, calibration=self._calibration())

    def on_test_end(self) -> None:
        self._runtime_model = None

    def _calibration(self) -> list | None:
        """An int8 runtime's calibration inputs: the first 256 images of the data's training split
        (``zoo._quantize.training_calibration``; never the split being tested); None for the other runtimes."""
        if not self.hparams.runtime.endswith('-int8'):
            return None
        dm = getattr(self.trainer, 'datamodule', None)
        if dm is None:
            raise ValueError(f'--runtime {self.hparams.runtime} calibrates on the training split: run zoo test '
                             f'with the recipe\'s --data')
        from zoo._quantize import training_calibration
        return training_calibration(dm)

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    # -- training plumbing -------------------------------------------------------------------------------------
    def log_train(self, loss: torch.Tensor, **parts: torch.Tensor) -> None:
        """Log the training loss (and its parts) on the steps the logger writes, with no host sync."""
        if (self.global_step + 1) % self.trainer.log_every_n_steps == 0 or self.trainer.is_last_batch:
            self.log('train/loss', loss, on_step=True, on_epoch=False, prog_bar=True)
            for k, v in parts.items():
                self.log(f'train/{k}', v, on_step=True, on_epoch=False)

    def on_fit_start(self) -> None:
        # timm's EMA keeps its copy in eval mode, which Lightning reports as "N modules in eval mode" on every
        # fit. The copy only runs in evaluation (which sets eval mode), so its mode while training is moot.
        if self.ema is not None:
            self.ema.train()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        loss = outputs['loss'] if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            bad = ~torch.isfinite(loss.detach())
            self._nonfinite = bad if self._nonfinite is None else self._nonfinite | bad
        if self.ema is not None:
            self.ema.update(self.model, step=self.global_step)
        # One host sync every log interval and before each epoch's validation/checkpoint, not per step.
        if self._nonfinite is not None and (self.global_step % self.trainer.log_every_n_steps == 0
                                            or self.trainer.is_last_batch):
            if bool(self._nonfinite):
                raise FloatingPointError(
                    f'{self.model_name}: the training loss became NaN or infinite by step {self.global_step}; '
                    f'stopped. Checkpoints saved before this point are intact (resume with --ckpt_path last '
                    f'and a lower learning rate or --trainer.gradient_clip_val).')

    def prediction_writer(self, run_dir):
        """The callback ``zoo predict`` writes this task's predictions with: the task's ``writer`` (default
        ``TensorWriter``: ``predictions.pt``), built on the run folder. A writer with options overrides this."""
        return tasks.get(self.task).load('writer')(run_dir)

    # -- optimisation ------------------------------------------------------------------------------------------
    def param_groups(self) -> list[dict]:
        """Trainable parameters; no weight decay on norms, biases and the model's ``no_weight_decay()``."""
        return optim.param_groups(self.model)

    def configure_optimizers(self):
        groups = self.param_groups()
        distiller = getattr(self, 'distiller', None)  # a distilling system's trainable adapter (recipes/distill.py);
        if distiller is not None and any(p.requires_grad for p in distiller.parameters()):  # never its teacher
            groups = groups + optim.param_groups(distiller)
        if not groups:
            raise ValueError(f'{self.model_name}: no trainable parameters')
        opt = optim.apply_lr_scale(self.optimizer_factory(groups))
        if self.scheduler_factory is None:
            return opt
        sched = self.scheduler_factory(opt)
        if hasattr(sched, 'bind'):  # a schedule sized from the run (optim.WarmupCosine)
            sched.bind(self.trainer)
        return {'optimizer': opt, 'lr_scheduler': {'scheduler': sched, 'interval': getattr(sched, 'interval',
                                                                                            'epoch')}}
