"""Image classification as a Lightning system: the step logic around a model from ``zoo.create``.

Cross-entropy with label smoothing, optional mixup/cutmix (timm's ``Mixup``) and top-1/top-5 accuracy
(torchmetrics). The model, the injected optimizer and schedule (the configs: AdamW or SGD, warm-up then
cosine), the EMA of the weights and the non-finite guard are :class:`ZooSystem`'s; gradient clipping is the
Trainer's (``trainer.gradient_clip_val``). ``zoo predict`` writes ``predictions.csv`` (id, label, score) and the
class probabilities (:class:`ProbabilityWriter`). ``distill`` adds a frozen teacher's logits, argmax or feature maps
as a second target (``recipes/distill.py``).
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from tqdm import tqdm  # its write() prints above a running progress bar, not glued to its line

from . import optim
from .distill import Distill, Distiller, classifier_forward
from .system import ZooSystem

__all__ = ['ImageClassifier', 'ProbabilityWriter', 'TensorWriter']


class ImageClassifier(ZooSystem):
    """Train, validate and test any registered classifier (or ``timm/<name>``).

    Args:
        label_smoothing: for the cross-entropy (also applied to mixed targets).
        mixup_alpha, cutmix_alpha, mixup_prob: timm ``Mixup``; off when both alphas are 0.
        distill: knowledge distillation from a trained teacher (:class:`zoo.recipes.distill.Distill`:
            ``{teacher: NAME, checkpoint: PATH, kind: logit|hard|feature, temperature: 4, alpha: 0.5, level: -1}``);
            the teacher (name, checkpoint sha256) is kept in the run's hyper-parameters and its accuracy on the
            validation split, measured when the fit starts, as the metric ``teacher/val_acc1``.
        Everything else: :class:`ZooSystem` (``name``, ``model_args``, ``optimizer``, ``lr_scheduler``,
        ``ema_decay``, ...).
    """

    task = 'classification'

    def __init__(self, name: str, label_smoothing: float = 0.0, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0,
                 mixup_prob: float = 1.0, distill: Optional[Distill] = None,
                 optimizer: OptimizerCallable = lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05),
                 lr_scheduler: Optional[LRSchedulerCallable] = lambda opt: optim.WarmupCosine(opt), **kwargs):
        super().__init__(name, optimizer=optimizer, lr_scheduler=lr_scheduler, **kwargs)
        self.num_classes = self.sizes.get('num_classes') or getattr(self.model, 'num_classes', None)
        if not self.num_classes:
            raise ValueError(f'{name}: could not tell the number of classes; pass num_classes')
        self.mixup = None
        if mixup_alpha > 0 or cutmix_alpha > 0:
            from timm.data import Mixup
            self.mixup = Mixup(mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, prob=mixup_prob,
                               label_smoothing=label_smoothing, num_classes=self.num_classes)
        from torchmetrics.classification import MulticlassAccuracy, MulticlassCalibrationError

        from .robustness import ECE_BINS
        top5 = min(5, self.num_classes)
        for split in ('val', 'test'):  # torchmetrics reduces these across processes itself
            setattr(self, f'{split}_acc1', MulticlassAccuracy(self.num_classes, top_k=1, average='micro'))
            setattr(self, f'{split}_acc5', MulticlassAccuracy(self.num_classes, top_k=top5, average='micro'))
            # expected calibration error (top-label, 15 bins, L1); its states are not saved in checkpoints
            setattr(self, f'{split}_ece', MulticlassCalibrationError(self.num_classes, n_bins=ECE_BINS, norm='l1'))
        self.corruption_reference = None  # zoo test --corruptions-reference: {(corruption, severity): top-1 error}
        self._corrupted: list = []        # one accuracy per corrupted test split (``on_test_start``)
        self.distiller = None
        if distill is not None:
            self.distiller = Distiller(distill, self.model, self.sizes, self.task, classifier_forward)
            self.hparams['distill'] = self.distiller.record()  # plain values, with the teacher's checkpoint sha256

    # -- steps -------------------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        x, y = batch
        soft = None
        if self.mixup is not None and len(x) % 2 == 0:  # timm's Mixup pairs samples: even batches only
            x, soft = self.mixup(x, y)
        if self.distiller is None:
            logits, feature = self.model(x), None
        else:
            logits, feature = self.distiller.student_outputs(self.model, x)
        if soft is not None:
            loss = torch.sum(-soft * F.log_softmax(logits, dim=-1), dim=-1).mean()
        else:
            loss = F.cross_entropy(logits, y, label_smoothing=self.hparams.label_smoothing)
        if self.distiller is None:
            self.log_train(loss)
            return loss
        task_loss = loss  # the teacher sees the same (mixed) images as the student
        loss, kd = self.distiller.loss(task_loss, x, logits, feature)
        self.log_train(loss, task_loss=task_loss, kd_loss=kd)
        return loss

    def on_train_start(self) -> None:
        """A distilling fit records its teacher's top-1 accuracy on the validation split (``teacher/val_acc1``),
        written straight to the run's loggers as :class:`FineTuner`'s probe is (one pass, before the first step)."""
        super().on_train_start()
        if self.distiller is None or not self.trainer.is_global_zero:
            return
        dm = getattr(self.trainer, 'datamodule', None)
        if dm is None or not hasattr(dm, 'val_dataloader'):
            return
        acc = self.distiller.teacher_accuracy(dm.val_dataloader(), limit=1 if self.trainer.fast_dev_run else None)
        for logger in self.loggers:
            logger.log_metrics({'teacher/val_acc1': acc, 'epoch': 0}, step=0)

    def _evaluate(self, batch, split: str):
        x, y = batch
        logits = self.eval_model(x)
        loss = F.cross_entropy(logits, y)
        acc1, acc5 = getattr(self, f'{split}_acc1'), getattr(self, f'{split}_acc5')
        ece = getattr(self, f'{split}_ece')
        acc1.update(logits, y)
        acc5.update(logits, y)
        ece.update(logits.float(), y)  # softmax inside; float: bf16 confidences would bin coarsely
        # add_dataloader_idx=False: the clean split keeps its names when corrupted splits follow it
        log = dict(on_step=False, on_epoch=True, add_dataloader_idx=False)
        self.log(f'{split}/loss', loss, sync_dist=True, **log)
        self.log(f'{split}/acc1', acc1, prog_bar=True, **log)
        self.log(f'{split}/acc5', acc5, **log)
        self.log(f'{split}/ece', ece, **log)
        return loss

    def validation_step(self, batch, batch_idx):
        return self._evaluate(batch, 'val')

    def test_step(self, batch, batch_idx, dataloader_idx: int = 0):
        """Dataloader 0 is the test split; ``zoo test --corruptions`` adds one per (corruption, severity) of the
        DataModule's ``test_corruptions``, whose accuracies ``on_test_epoch_end`` turns into ``test_c/*``."""
        if dataloader_idx == 0:
            return self._evaluate(batch, 'test')
        x, y = batch
        self._corrupted[dataloader_idx - 1].update(self.eval_model(x), y)

    def on_test_start(self) -> None:
        super().on_test_start()
        from torchmetrics.classification import MulticlassAccuracy

        splits = getattr(self.trainer.datamodule, 'test_corruptions', ()) if self.trainer.datamodule else ()
        # a plain list: not registered as sub-modules, so never in a state dict
        self._corrupted = [MulticlassAccuracy(self.num_classes, top_k=1, average='micro').to(self.device)
                           for _ in splits]

    def on_test_epoch_end(self) -> None:
        """The corruption metrics (``robustness.corruption_metrics``): accuracy per corruption and severity, their
        means, the unnormalised mean corruption error ``test_c/ce`` and, with a reference, ``test_c/mce``."""
        if not self._corrupted:
            return
        from .robustness import corruption_metrics

        splits = self.trainer.datamodule.test_corruptions
        acc = {(c, s): float(m.compute()) for (c, s), m in zip(splits, self._corrupted)}  # synced across ranks
        for name, value in corruption_metrics(acc, self.corruption_reference).items():
            self.log(name, value, add_dataloader_idx=False, rank_zero_only=True)
        self._corrupted = []

    def predict_step(self, batch, batch_idx):
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self.eval_model(x).softmax(dim=-1)

    def prediction_writer(self, run_dir: Path) -> BasePredictionWriter:
        return ProbabilityWriter(run_dir)

    def test_writer(self, run_dir: Path):
        """``zoo test``: the reliability diagram of the test split, ``reliability.png`` in the run folder."""
        from .robustness import ReliabilityWriter
        return ReliabilityWriter(run_dir)


class TensorWriter(BasePredictionWriter):
    """``zoo predict``: the system's ``predict_step`` outputs, concatenated, as ``predictions.pt`` (per rank under
    DDP: ``predictions-rank<k>.pt``)."""

    def __init__(self, run_dir: str | Path):
        super().__init__(write_interval='epoch')
        self.run_dir = Path(run_dir)

    def _name(self, trainer, suffix: str) -> Path:
        rank = f'-rank{trainer.global_rank}' if trainer.world_size > 1 else ''
        return self.run_dir / f'predictions{rank}{suffix}'

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices) -> None:
        if predictions and isinstance(predictions[0], list):  # several dataloaders: keep the first
            predictions = predictions[0]
        if not predictions or not all(isinstance(o, torch.Tensor) for o in predictions):
            return
        out = torch.cat(predictions)
        torch.save(out, self._name(trainer, '.pt'))
        written = self.also_write(trainer, out)
        saved = ', '.join(map(str, [self._name(trainer, '.pt'), *written]))
        tqdm.write(f'zoo predict: {len(out)} predictions saved to {saved}')

    def also_write(self, trainer, out: torch.Tensor) -> list[Path]:
        return []


def predicted_dataset(trainer):
    """The dataset ``zoo predict`` ran on: ``--images DIR``'s files (the DataModule's ``predict_set``, which carries
    ``image_files``), else the test split."""
    dm = trainer.datamodule
    dataset = getattr(dm, 'predict_set', None)
    return dataset if dataset is not None else getattr(dm, 'test_set', None)


class ProbabilityWriter(TensorWriter):
    """Class probabilities: ``predictions.pt`` and ``predictions.csv`` (sample id in the predict split, label,
    score), a table a person can read. For ``--images DIR``: ``file`` (below DIR), ``label`` (the class name),
    ``score``, then the next classes of the top 5 (``label_2, score_2, ...``)."""

    def also_write(self, trainer, probs: torch.Tensor) -> list[Path]:
        if probs.ndim != 2:
            return []
        path = self._name(trainer, '.csv')
        files = getattr(predicted_dataset(trainer), 'image_files', None)
        if files is not None:
            names = getattr(trainer.datamodule, 'names', None) or [str(c) for c in range(probs.shape[1])]
            scores, labels = probs.float().topk(min(5, probs.shape[1]), dim=1)
            header = ['file', 'label', 'score'] + [f'{k}_{r}' for r in range(2, scores.shape[1] + 1)
                                                   for k in ('label', 'score')]
            rows = [[files.files[i]]
                    + [v for c, p in zip(ls.tolist(), ps.tolist()) for v in (names[c], f'{p:.6f}')]
                    for i, (ls, ps) in enumerate(zip(labels, scores))]
            with path.open('w', newline='') as f:  # csv quotes a file name with a comma in it
                csv.writer(f).writerows([header, *rows])
            return [path]
        score, label = probs.float().max(dim=1)
        lines = ['id,label,score'] + [f'{i},{int(c)},{float(p):.6f}' for i, (c, p) in enumerate(zip(label, score))]
        path.write_text('\n'.join(lines) + '\n')
        return [path]
