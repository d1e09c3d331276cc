"""Tasks: what a model is trained for, as one registered object each.

A :class:`Task` knows everything the rest of zoo used to branch on a task's name for: its primary metric and
whether higher or lower is better, its input (one function for one sample's shape and one for a random example
batch), the DataModule base and Lightning system that train it, the writer ``zoo predict`` uses and the
metrics the leaderboard shows beside the primary one.

>>> import zoo.tasks
>>> zoo.tasks.get('segmentation').metric, zoo.tasks.get('segmentation').mode
('val/miou', 'max')
>>> zoo.tasks.input_size('llama_tiny', context_length=128)
(128,)
>>> x = zoo.tasks.example_input(model, batch_size=2)          # the model's own input, as bench and export use it

Adding a task is ``register_task(Task('depth', metric='val/rmse', mode='min', datamodule=..., system=...))``
plus its DataModule (``zoo_task = 'depth'``) and its system (``task = 'depth'``); nothing else names a task.

This module is part of ``import zoo``'s light path: it imports neither torch nor Lightning at import time. The
DataModule, system and writer are dotted paths, resolved (imported) only when asked for with :meth:`Task.load`.
"""
from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import Callable

__all__ = ['Task', 'register_task', 'unregister_task', 'get', 'names', 'task_of', 'input_size', 'example_input',
           'metric_mode', 'UnknownTaskError']


# ------------------------------------------------------------------------------------------ input specs
# A task's input spec is two functions: ``shape(registered, model, *, img_size, in_chans, context_length)`` gives
# one sample's shape and ``sample(model, shape, batch_size, generator)`` draws a random batch of it. Images and
# token windows cover every task so far; a task with another input passes its own pair.

def _pair(size) -> tuple[int, int]:
    return (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))


def image_shape(registered: tuple, model=None, *, img_size=None, in_chans=None, context_length=None) -> tuple:
    """(C, H, W): the registry's size, then what the built ``model`` says of itself (its ``in_chans`` or its
    backbone's, its ``img_size``, PIIP's largest branch ``img_sizes[-1]``), then the caller's ``in_chans`` and
    ``img_size`` (an int or (H, W)), which win. A detector's backbone may be built for another size than the
    detector's input, so only its ``in_chans`` is read."""
    c, h, w = registered
    if model is not None:
        c = getattr(model, 'in_chans', getattr(getattr(model, 'backbone', None), 'in_chans', c))
        if getattr(model, 'img_size', None) is not None:
            h, w = _pair(model.img_size)
        elif getattr(model, 'img_sizes', None):
            h, w = _pair(model.img_sizes[-1])
    if in_chans is not None:
        c = in_chans
    if img_size is not None:
        h, w = _pair(img_size)
    return int(c), int(h), int(w)


def image_sample(model, shape: tuple, batch_size: int, generator=None):
    """A float batch ``(batch_size, *shape)`` from the standard normal."""
    import torch
    return torch.randn(batch_size, *shape, generator=generator)


def token_shape(registered: tuple, model=None, *, img_size=None, in_chans=None, context_length=None) -> tuple:
    """(T,): the registry's context length, or the data's ``context_length`` (an exported graph has one length)."""
    return (int(context_length or registered[-1]),)


def token_sample(model, shape: tuple, batch_size: int, generator=None):
    """A (batch_size, T) long tensor of token ids below the model's ``vocab_size`` (else its first embedding's)."""
    import torch
    from torch import nn

    vocab = getattr(model, 'vocab_size', None)
    if not isinstance(vocab, int):
        emb = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
        if emb is None:
            raise ValueError(f'{type(model).__name__}: a language model needs a vocab_size attribute or an '
                             'nn.Embedding to draw token ids from')
        vocab = emb.num_embeddings
    return torch.randint(0, vocab, (batch_size, *shape), generator=generator)


# ------------------------------------------------------------------------------------------------ the Task
# How a task's data feeds images (``pretrained_cfg``'s mean/std/crop): 'imagenet_crop' ImageNet mean/std and timm's
# resize + centre crop (classification), 'imagenet' ImageNet mean/std on the whole image (segmentation), 'unit'
# [0, 1] pixels, whole (detection, denoising, and the default for a new task).
PIXELS = ('imagenet_crop', 'imagenet', 'unit')


@dataclass(frozen=True)
class Task:
    """One task. ``metric`` is what "best" checkpoints, sweeps and leaderboards rank by, ``mode`` its direction
    ('max': higher is better, 'min': lower is better). ``shape``/``sample`` are its input spec (above).
    ``datamodule``, ``system`` and ``writer`` are dotted paths (``'zoo.recipes.detection.Detection'``) so that
    registering a task imports no Lightning; ``board_columns`` are metrics shown beside ``metric`` on a board.
    ``output`` names the exported graph's output; ``pixels`` says how its data feeds images, which a model's
    ``pretrained_cfg`` repeats (one of :data:`PIXELS`)."""
    name: str
    metric: str
    mode: str = 'max'
    shape: Callable = field(default=image_shape, repr=False)
    sample: Callable = field(default=image_sample, repr=False)
    datamodule: str = ''
    system: str = ''
    writer: str = 'zoo.recipes.classification.TensorWriter'
    board_columns: tuple = ()
    output: str = 'logits'
    pixels: str = 'unit'
    doc: str = ''

    def __post_init__(self):
        if self.mode not in ('max', 'min'):
            raise ValueError(f"task {self.name!r}: mode is 'max' (higher is better) or 'min'; got {self.mode!r}")
        if self.pixels not in PIXELS:
            raise ValueError(f'task {self.name!r}: pixels is one of {", ".join(PIXELS)}; got {self.pixels!r}')
        if not self.metric or '/' not in self.metric:
            raise ValueError(f"task {self.name!r}: metric is a logged name such as 'val/acc1'; got {self.metric!r}")
        object.__setattr__(self, 'board_columns', tuple(self.board_columns))

    @property
    def higher_is_better(self) -> bool:
        return self.mode == 'max'

    @property
    def direction(self) -> str:
        """Optuna's word for ``mode``: 'maximize' or 'minimize'."""
        return 'maximize' if self.mode == 'max' else 'minimize'

    @property
    def takes_tokens(self) -> bool:
        """Whether its input is token ids (no images: ``zoo predict --images`` does not apply)."""
        return self.sample is token_sample

    def load(self, what: str):
        """The object behind ``datamodule``, ``system`` or ``writer`` (imported now)."""
        path = getattr(self, what)
        if not path:
            raise ValueError(f'task {self.name!r} declares no {what}')
        module, _, attr = path.rpartition('.')
        return getattr(importlib.import_module(module), attr)


class UnknownTaskError(KeyError, ValueError):
    """An unknown task name (a ``KeyError`` for look-ups, a ``ValueError`` for arguments)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


_TASKS: dict[str, Task] = {}


def register_task(task: Task, *, replace: bool = False) -> Task:
    """Make ``task`` known by its name; a second registration of a name is an error unless ``replace``."""
    if task.name in _TASKS and not replace:
        raise ValueError(f'task {task.name!r} is registered twice')
    _TASKS[task.name] = task
    return task


def unregister_task(name: str) -> None:
    """Forget a task (tests that register a toy one)."""
    _TASKS.pop(name, None)


def names() -> tuple[str, ...]:
    """The registered tasks, in registration order (the built-in ones first)."""
    return tuple(_TASKS)


def get(name: str) -> Task:
    """The registered task ``name``; an unknown name is a one-line error with the close matches."""
    try:
        return _TASKS[name]
    except (KeyError, TypeError):
        close = difflib.get_close_matches(str(name), list(_TASKS), n=3, cutoff=0.5)
        raise UnknownTaskError(f'unknown task {name!r}' + (f"; did you mean {' or '.join(close)}?" if close else '')
                               + f' (tasks: {", ".join(_TASKS)})') from None


def metric_mode(metric: str) -> str | None:
    """'max' or 'min' for a task's primary metric (the task says), by its name after the split: ``test/rmse`` is
    ranked as ``val/rmse`` is; else None. Board columns are shown, not ranked by, so they have no say here."""
    leaf = str(metric).rsplit('/', 1)[-1]
    for t in _TASKS.values():
        if leaf == t.metric.rsplit('/', 1)[-1]:
            return t.mode
    return None


# ---------------------------------------------------------------------- one input size, one example input
def _registered(name):
    from ._registry import _MODELS, _load_families
    if not isinstance(name, str) or name.startswith('timm/'):
        return None
    _load_families()
    return _MODELS.get(name)


def task_of(model) -> str:
    """The task of a model (a module or a name): its registry record's; a ``timm/`` model or a plain module is
    a classifier, unless it carries an integer ``vocab_size`` (a language model)."""
    name = model if isinstance(model, str) else getattr(model, 'zoo_name', None)
    info = _registered(name)
    if info is not None:
        return info.task
    if not isinstance(model, str) and isinstance(getattr(model, 'vocab_size', None), int):
        return 'language_modeling'
    return 'classification'


def input_size(model, *, img_size=None, in_chans=None, context_length=None, task: str | None = None) -> tuple:
    """One sample's shape (no batch dimension) for ``model``, a module or a name (``timm/<name>`` too): (C, H, W)
    for images, (T,) for token ids. The start is what a built model says it was built for, its
    ``pretrained_cfg['input_size']`` (a zoo model's is the task's ``shape`` of the registry's size and the model's
    own ``in_chans``/``img_size``), else the registry's input size of the name (else 3x224x224); the task's
    ``shape`` function then applies the caller's ``img_size``/``in_chans`` (images) or ``context_length`` (tokens),
    as the data set them. The one place zoo derives an input size: bench, profile, export, the results logger, the
    runtimes, the systems and ``pretrained_cfg`` (through the task's ``shape``) use it."""
    module = None if isinstance(model, str) else model
    info = _registered(model if isinstance(model, str) else getattr(model, 'zoo_name', None))
    built = dict(getattr(module, 'pretrained_cfg', None) or {}).get('input_size')
    if built:  # a built zoo or timm model's cfg already says what it was built for
        registered, module = tuple(built), None
    else:
        registered = tuple(info.input_size) if info is not None else (3, 224, 224)
    spec = get(task or task_of(model))
    if spec.shape is image_shape and len(registered) != 3:   # a registry size of another rank: as recorded
        return registered
    return tuple(spec.shape(registered, module, img_size=img_size, in_chans=in_chans, context_length=context_length))


def example_input(model, size=None, batch_size: int = 1, task: str | None = None, generator=None):
    """A random batch of ``batch_size`` inputs of ``model``: ``size`` (one sample's shape; default
    :func:`input_size` of the model) drawn by its task's ``sample`` function (token ids below the vocabulary for
    a language model, a float image batch otherwise). ``task`` defaults to :func:`task_of`. The one example-input
    function (``zoo.eval.profile.example_input`` is this one)."""
    spec = get(task or task_of(model))
    shape = input_size(model, task=spec.name) if size is None else tuple(size)
    return spec.sample(model, shape, batch_size, generator)


# ------------------------------------------------------------------------------------------ built-in tasks
register_task(Task(
    'classification', 'val/acc1', 'max',
    datamodule='zoo.datasets._base.ImageDataModule', system='zoo.recipes.classification.ImageClassifier',
    writer='zoo.recipes.classification.ProbabilityWriter', board_columns=('val/acc5',), pixels='imagenet_crop',
    doc='image classification (top-1 accuracy)'))
register_task(Task(
    'detection', 'val/map', 'max',
    datamodule='zoo.datasets.detection.datamodules.DetectionDataModule', system='zoo.recipes.detection.Detection',
    writer='zoo.recipes.detection.DetectionWriter', board_columns=('val/map50', 'val/map75'),
    doc='object detection (COCO mAP@[.5:.95])'))
register_task(Task(
    'language_modeling', 'val/acc', 'max', shape=token_shape, sample=token_sample,
    datamodule='zoo.datasets.synthetic_data.SyntheticLMDataModule', system='zoo.recipes.lm.CausalLM',
    doc='causal language modelling on the synthetic reasoning tasks (answer accuracy)'))
register_task(Task(
    'denoising', 'val/psnr', 'max',
    datamodule='zoo.datasets.photos.PhotoPatchesDataModule', system='zoo.recipes.denoising.Denoiser',
    writer='zoo.recipes.denoising.DenoisedWriter', board_columns=('val/ssim',), output='denoised',
    doc='Gaussian denoising (PSNR)'))
register_task(Task(
    'segmentation', 'val/miou', 'max',
    datamodule='zoo.datasets.segmentation.datamodules.SegmentationDataModule',
    system='zoo.recipes.segmentation.Segmentation', writer='zoo.recipes.segmentation.SegmentationWriter',
    board_columns=('val/macc', 'val/aacc'), pixels='imagenet', doc='semantic segmentation (mIoU)'))
