"""Knowledge distillation: a frozen teacher's outputs as a second target for the student a system trains.

Three kinds, chosen by :class:`Distill` (``--model.distill '{teacher: NAME, checkpoint: PATH, kind: logit}'``):

- ``logit``: Hinton, Vinyals & Dean 2015, "Distilling the Knowledge in a Neural Network"
  (https://arxiv.org/abs/1503.02531): the KL divergence between the teacher's and the student's softmax at
  temperature ``T``, times ``T**2`` so its gradients keep their size as ``T`` changes; batch-mean, as timm's
  ``timm.task.distillation.LogitDistillationTask`` computes it (DeiT's 'soft' divides by ``B * classes`` instead).
- ``hard``: DeiT's hard-label distillation (Touvron et al. 2021, "Training data-efficient image transformers &
  distillation through attention", https://github.com/facebookresearch/deit ``losses.py`` ``DistillationLoss``
  with ``distillation_type='hard'``): cross-entropy against the teacher's argmax.
- ``feature``: the student's map at one ``forward_intermediates`` level (a detector's: one neck output) through a
  1x1-convolution adapter onto the teacher's channels, resized to the teacher's map (bilinear), MSE against it;
  timm's ``FeatureDistillationTask`` does the same with a linear adapter on the pooled pre-logits.

A detector distils ``logit`` (its class scores per anchor, :func:`dense_logit_loss`) or ``feature``.

The loss is DeiT's mixture: ``(1 - alpha) * task loss + alpha * distillation loss``.

timm's tasks own their training loop (``TrainingTask``), which a Lightning system does not use, and hold the two
loss lines inline; the losses are those lines here (:func:`logit_loss`, :func:`hard_loss`, :func:`feature_loss`).

The teacher is built once by ``zoo.create`` (a zoo name or ``timm/<name>``) and loaded strictly from its
checkpoint (``zoo.load_checkpoint``: a ``zoo fit`` .ckpt gives its evaluated weights), frozen and in eval mode.
It is kept *outside* the system's module tree (:class:`Distiller` does not register it), so it is in no
optimizer group, no EMA, no checkpoint and no model summary; :meth:`Distiller.teacher_outputs` moves it to the
batch's device. The feature adapter is a registered, trainable module: in the optimizer and the checkpoint (a
resumed run continues it), never in ``model.*`` weights, so ``zoo.create(checkpoint=)`` and ``zoo export`` of a
distilled run read the student alone.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo import tasks

from .errors import close_matches

__all__ = ['Distill', 'Distiller', 'KINDS', 'logit_loss', 'dense_logit_loss', 'hard_loss', 'feature_loss', 'FeatureAdapter',
           'classifier_forward', 'dense_forward', 'file_sha256']

KINDS = ('logit', 'hard', 'feature')


@dataclass
class Distill:
    """What to distil from (the ``distill`` argument of ``ImageClassifier`` and ``Detection``).

    Args:
        teacher: the teacher's model name (``zoo list``; ``timm/<name>`` for a timm classifier).
        checkpoint: the teacher's weights (a ``zoo fit`` .ckpt, a state dict or .safetensors), loaded strictly.
        kind: ``logit`` (Hinton's soft targets), ``hard`` (DeiT's teacher argmax) or ``feature`` (one level's
            maps through an adapter, MSE); detection distils ``feature`` only.
        temperature: the softmax temperature of ``logit``.
        alpha: the distillation loss's weight; the task loss gets ``1 - alpha``.
        level: the feature level of ``feature`` (a ``forward_intermediates`` index of both classifiers, negative
            from the end; for a detector an index into the neck's outputs, ``-1`` the coarsest).
        model_args: more arguments for ``zoo.create(teacher, ...)`` (the teacher run's ``model_args``).
    """
    teacher: str
    checkpoint: str
    kind: str = 'logit'
    temperature: float = 4.0
    alpha: float = 0.5
    level: int = -1
    model_args: Optional[dict] = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f'distill.kind must be one of {", ".join(KINDS)}, got {self.kind!r}'
                             f'{close_matches(str(self.kind), KINDS)}')
        if not self.temperature > 0:
            raise ValueError(f'distill.temperature must be > 0, got {self.temperature}')
        if not 0 <= self.alpha <= 1:
            raise ValueError(f'distill.alpha must be in [0, 1] (the distillation loss\'s weight), got {self.alpha}')


# -- the losses ------------------------------------------------------------------------------------------------
def logit_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """Hinton's soft-target loss: ``KL(softmax(t / T) || softmax(s / T)) * T**2``, mean over the batch."""
    log_s = F.log_softmax(student / temperature, dim=-1)
    log_t = F.log_softmax(teacher / temperature, dim=-1)
    return F.kl_div(log_s, log_t, reduction='batchmean', log_target=True) * temperature ** 2


def dense_logit_loss(student: list, teacher: list, num_classes: int, temperature: float) -> torch.Tensor:
    """Soft targets for a dense detector's class scores: per anchor and class, the binary cross-entropy between the
    student's sigmoid at temperature ``T`` and the teacher's (the sigmoid analogue of Hinton's softmax, since
    YOLOv8's classes are independent sigmoids), times ``T**2``, summed over classes and averaged over the batch's
    anchors. ``student``/``teacher``: the raw maps, one (B, 4 * reg_max + nc, H_i, W_i) per level; the class logits
    are each map's last ``num_classes`` channels (``DetectHead.split``'s layout), so the two box branches may differ."""
    def classes(maps):  # (B, 4R + nc, H_i, W_i) per level -> (B, nc, A)
        return torch.cat([m[:, -num_classes:].flatten(2) for m in maps], 2)

    s, t = classes(student), classes(teacher)
    if s.shape != t.shape:
        raise ValueError(f'distill: the student and teacher predict on different anchors ({tuple(s.shape)} vs '
                         f'{tuple(t.shape)}); logit distillation needs the same strides and input size')
    bce = F.binary_cross_entropy_with_logits(s.float() / temperature, torch.sigmoid(t.float() / temperature),
                                             reduction='none')
    return bce.sum(1).mean() * temperature ** 2


def hard_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """DeiT's hard distillation: cross-entropy against the teacher's predicted class."""
    return F.cross_entropy(student, teacher.argmax(dim=-1))


class FeatureAdapter(nn.Module):
    """A 1x1 convolution from the student's channels to the teacher's (a per-position linear map), then a bilinear
    resize of the student's map to the teacher's height and width: (B, Cs, Hs, Ws) -> (B, Ct, Ht, Wt)."""

    def __init__(self, student_chs: int, teacher_chs: int):
        super().__init__()
        self.proj = nn.Conv2d(student_chs, teacher_chs, kernel_size=1)

    def forward(self, x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        x = self.proj(x)  # (B, Cs, Hs, Ws) -> (B, Ct, Hs, Ws)
        if tuple(x.shape[-2:]) != tuple(size):
            x = F.interpolate(x, size=size, mode='bilinear', align_corners=False)  # -> (B, Ct, Ht, Wt)
        return x


def feature_loss(adapter: FeatureAdapter, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """MSE between the adapted student map and the teacher's map (timm's FeatureDistillationTask's loss)."""
    return F.mse_loss(adapter(student, teacher.shape[-2:]), teacher)


# -- what a model gives: (output, the map at one level) -------------------------------------------------------
def classifier_forward(model: nn.Module, x: torch.Tensor, level: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A classifier's logits and, for ``level`` not None, its NCHW map at that ``forward_intermediates`` index,
    from one pass (timm's ``forward_intermediates`` then ``forward_head`` on the final features)."""
    if level is None:
        return model(x), None
    final, maps = model.forward_intermediates(x, indices=[level])
    return model.forward_head(final), maps[0]


def dense_forward(model: nn.Module, x: torch.Tensor, level: int | None) -> tuple[list, torch.Tensor | None]:
    """A dense model's raw head outputs and, for ``level`` not None, that neck output (``DenseModel.forward_neck``)."""
    neck = model.forward_neck(x)
    return model.head(neck), (None if level is None else neck[level])


def _levels(model: nn.Module, forward: Callable) -> int:
    """How many feature levels ``level`` may index: a classifier's ``feature_info``, a dense model's head strides."""
    if forward is dense_forward:
        return len(model.strides)
    info = getattr(model, 'feature_info', None)
    if info is None or not hasattr(model, 'forward_intermediates'):
        return 0
    return len(info)


def file_sha256(path: str | Path, hex_chars: int | None = 16) -> str:
    """The first ``hex_chars`` hex digits of a file's sha256 (what names a teacher's weights in the results DB;
    None: all 64, what ``zoo weights --verify`` compares with a release's hash)."""
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()[:hex_chars]  # [:None] is the whole digest


class Distiller(nn.Module):
    """The teacher (frozen, not registered as a submodule), the loss of its kind and, for ``feature``, the
    trainable :class:`FeatureAdapter` (a registered submodule).

    Args:
        spec: the :class:`Distill` choices (a dict is read as one).
        student: the network being trained (its channels at ``spec.level`` size the adapter).
        sizes: the sizes the data knows (``num_classes``, ``img_size``, ...) for ``zoo.create`` of the teacher.
        task: the student's task; the teacher must be a model of it.
        forward: :func:`classifier_forward` or :func:`dense_forward`.
        kinds: the kinds this task supports.
    """

    def __init__(self, spec: Distill | dict, student: nn.Module, sizes: dict, task: str,
                 forward: Callable = classifier_forward, kinds: tuple[str, ...] = KINDS):
        super().__init__()
        from .system import require_task  # the same one-line error as the student's name gets

        if not isinstance(spec, Distill):  # a checkpoint's hyper-parameters also hold what record() added
            spec = Distill(**{k: v for k, v in dict(spec).items() if k != 'checkpoint_sha256'})
        if spec.kind not in kinds:
            raise ValueError(f'distill.kind {spec.kind!r}: the {task} system distils {", ".join(kinds)}')
        if not Path(spec.checkpoint).is_file():
            raise FileNotFoundError(f'distill.checkpoint: no file {spec.checkpoint} (the teacher\'s weights; train '
                                    f'it with zoo fit and give its .ckpt)')
        try:
            require_task(spec.teacher, task, 'distill.teacher')
        except KeyError as e:  # an unknown name: the registry's message with its close matches, on one line
            raise ValueError(f'distill.teacher: {e.args[0]}') from None
        self.spec, self.forward_fn = spec, forward
        self.level = spec.level if spec.kind == 'feature' else None
        self.adapter = None
        # Paired seeds: a seed must fix the student's initialisation and the data order in a run with and without
        # a teacher, so what is built here draws from a forked random state and leaves the global one untouched.
        with torch.random.fork_rng(devices=[]):
            teacher = zoo.create_with_optional(spec.teacher, sizes, **dict(spec.model_args or {}))
            zoo.load_checkpoint(teacher, spec.checkpoint)  # strict: a teacher with a fresh head would teach noise
            teacher.eval().requires_grad_(False)
            self.__dict__['teacher'] = teacher  # not a submodule: out of the optimizer, the EMA and the state_dict
            if self.level is not None:
                self.adapter = self._make_adapter(student, teacher, sizes, task)
        self.checkpoint_sha256 = file_sha256(spec.checkpoint)

    def _make_adapter(self, student: nn.Module, teacher: nn.Module, sizes: dict, task: str) -> FeatureAdapter:
        """Checks ``level`` against both models and sizes the adapter from one example batch through each."""
        level = self.level
        for role, model, name in (('student', student, getattr(student, 'zoo_name', '')),
                                  ('teacher', teacher, self.spec.teacher)):
            n = _levels(model, self.forward_fn)
            if not -n <= level < n:
                raise ValueError(f'distill.level {level}: the {role} {name} has '
                                 + (f'{n} feature levels ({-n}..{n - 1})' if n else 'no forward_intermediates'))
        size = tasks.input_size(student, img_size=sizes.get('img_size'), in_chans=sizes.get('in_chans'), task=task)
        x = tasks.example_input(student, size, 1, task)
        was_training = student.training
        with torch.no_grad():
            s = self.forward_fn(student.eval(), x, level)[1]
            t = self.forward_fn(teacher, x, level)[1]
        student.train(was_training)
        return FeatureAdapter(s.shape[1], t.shape[1])

    # -- training ----------------------------------------------------------------------------------------------
    def student_outputs(self, student: nn.Module, x: torch.Tensor):
        """The student's output and, for ``feature``, its map at ``level`` (one pass)."""
        return self.forward_fn(student, x, self.level)

    @torch.no_grad()
    def teacher_outputs(self, x: torch.Tensor):
        teacher = self.teacher
        param = next(teacher.parameters(), None)
        if param is not None and param.device != x.device:  # not a submodule, so Lightning did not move it
            teacher.to(x.device)
        return self.forward_fn(teacher, x, self.level)

    def loss(self, task_loss: torch.Tensor, x: torch.Tensor, output, feature) -> tuple[torch.Tensor, torch.Tensor]:
        """``((1 - alpha) * task_loss + alpha * kd, kd)`` for the student's ``output`` / ``feature`` on ``x``."""
        t_out, t_feat = self.teacher_outputs(x)
        kind = self.spec.kind
        if kind == 'logit' and self.forward_fn is dense_forward:
            kd = dense_logit_loss(output, t_out, self.teacher.head.num_classes, self.spec.temperature)
        elif kind == 'logit':
            kd = logit_loss(output, t_out, self.spec.temperature)
        elif kind == 'hard':
            kd = hard_loss(output, t_out)
        else:
            kd = feature_loss(self.adapter, feature, t_feat)
        alpha = self.spec.alpha
        return (1 - alpha) * task_loss + alpha * kd, kd

    def record(self) -> dict:
        """What the run's hyper-parameters keep of the distillation (the results database's ``hparams``)."""
        return {**asdict(self.spec), 'checkpoint_sha256': self.checkpoint_sha256}

    def train(self, mode: bool = True) -> 'Distiller':
        super().train(mode)
        self.teacher.eval()  # Lightning puts the system in train mode every epoch; the teacher's BN stays frozen
        return self

    @torch.no_grad()
    def teacher_accuracy(self, loader, limit: int | None = None) -> float:
        """The teacher's top-1 accuracy (a fraction, as ``val/acc1``) on ``loader``'s ``(images, labels)`` batches (the first ``limit``)."""
        from torchmetrics.classification import MulticlassAccuracy

        metric = None
        with torch.random.fork_rng(devices=[]):  # a DataLoader's iterator draws a seed: keep the training order
            for i, (x, y) in enumerate(loader):
                if limit is not None and i >= limit:
                    break
                logits = self.teacher_outputs(x)[0]
                if metric is None:
                    metric = MulticlassAccuracy(logits.shape[-1], top_k=1, average='micro')
                metric.update(logits.cpu(), y.cpu())
        return float(metric.compute()) if metric is not None else float('nan')
