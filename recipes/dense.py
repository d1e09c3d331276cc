"""``DenseSystem``: what the detection and segmentation systems share, so each keeps only its task's lines.

Both follow the dense-task contract (docs/design: torchvision's FCOS, detectron2's dense detectors, mmyolo's heads,
mmseg's segmentors): an evaluation batch is ``(images, targets)``, one dict per image carrying its metadata
(``orig_size``, ``scale``, ``pad``, ``index``) and its file's ground truth; the model's head owns the loss and the
prediction in the file's pixels; the metric scores there. The base owns the loop around that:

- ``validation_step`` / ``test_step``: the task's :meth:`DenseSystem.infer` (loss, predictions in file pixels, the
  head's outputs), the loss logged as ``<split>/loss``, the metric updated (:meth:`update_metric`), and for the
  first validation batch the sample the grid draws (:meth:`plot_sample`);
- the epoch ends: the metric (``<split>_metric``) computed, logged by the rows of :meth:`metric_rows`, reset;
- one validation grid per validation, ``<run>/val_predictions/epochNNN-stepS.png``, of the task's tiles
  (:meth:`grid_tiles`, ``grid_columns`` to a row);
- ``predict_step``: ``model(x, targets)`` (eval mode: the head's prediction in each file's pixels) with each image's
  metadata, for the task's :class:`DenseWriter`.

:class:`DenseWriter` is ``zoo predict``'s scaffolding: rank zero only, the predicted dataset (the test split or
``--images DIR``), one name per image (its file's path below DIR, else the task's name), the folders made; a task
writes one image (:meth:`DenseWriter.write`) and says what it wrote (:meth:`DenseWriter.summary`).
"""
from __future__ import annotations

from pathlib import Path

import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from tqdm import tqdm  # its write() prints above a running progress bar, not glued to its line

from .system import ZooSystem

__all__ = ['DenseSystem', 'DenseWriter', 'image_metadata']


def image_metadata(targets) -> list[dict]:
    """Each target's metadata without its tensors (ground truth, masks): what ``zoo predict`` keeps per image until
    the writer runs, so a test split's ground truth is not held in memory."""
    return [{k: v for k, v in t.items() if not isinstance(v, torch.Tensor)} for t in targets]


class DenseSystem(ZooSystem):
    """A detection or segmentation system (see the module docstring). A task defines :meth:`infer`,
    :meth:`update_metric`, :meth:`metric_rows`, :meth:`plot_sample`, :meth:`grid_tiles`, ``grid_columns``, sets
    ``val_metric`` / ``test_metric`` (torchmetrics: they gather every process's state themselves) and takes a
    ``plot_images`` argument (how many validation images the grid shows; 0: none)."""

    grid_columns = 2    # tiles per row of the validation grid
    _plot_batch = None  # what the grid draws, kept from the first validation batch

    # -- what a task defines ---------------------------------------------------------------------------------
    def infer(self, model, x: torch.Tensor, targets: list[dict]) -> tuple[torch.Tensor, list[dict], object]:
        """``(loss, predictions in file pixels (one dict per image), the head's outputs)`` of one batch."""
        raise NotImplementedError(f'{type(self).__name__} must define infer (its head\'s loss and prediction)')

    def update_metric(self, metric, predictions: list[dict], targets: list[dict]) -> None:
        raise NotImplementedError(f'{type(self).__name__} must define update_metric')

    def metric_rows(self, split: str, stats: dict) -> list[tuple[str, float, bool]]:
        """``(name, value, on the progress bar)`` per logged metric, from ``metric.compute()``."""
        raise NotImplementedError(f'{type(self).__name__} must define metric_rows')

    def plot_sample(self, model, x: torch.Tensor, targets: list[dict], outputs, n: int):
        """What :meth:`grid_tiles` draws of the first ``n`` validation images (on the CPU)."""
        raise NotImplementedError(f'{type(self).__name__} must define plot_sample')

    def grid_tiles(self, sample) -> list[torch.Tensor]:
        """uint8 (3, S, S) tiles, ``grid_columns`` to a row."""
        raise NotImplementedError(f'{type(self).__name__} must define grid_tiles')

    # -- evaluation --------------------------------------------------------------------------------------------
    def _evaluate(self, batch, split: str, batch_idx: int) -> None:
        x, targets = batch
        model = self.eval_model
        model.eval()
        loss, predictions, outputs = self.infer(model, x, targets)
        self.log(f'{split}/loss', loss, on_step=False, on_epoch=True, batch_size=len(x), sync_dist=True)
        self.update_metric(getattr(self, f'{split}_metric'), predictions, targets)
        n = min(self.hparams.plot_images, len(x))
        if split == 'val' and batch_idx == 0 and n > 0:
            self._plot_batch = self.plot_sample(model, x, targets, outputs, n)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, 'val', batch_idx)

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, 'test', batch_idx)

    def _log_metric(self, split: str) -> None:
        metric = getattr(self, f'{split}_metric')
        if not metric.update_called:  # no batch this epoch
            return
        stats = metric.compute()
        metric.reset()
        for name, value, bar in self.metric_rows(split, stats):
            self.log(f'{split}/{name}', float(value), prog_bar=bar)

    def on_validation_epoch_end(self) -> None:
        self._log_metric('val')
        if self._plot_batch is not None and not self.trainer.sanity_checking and self.trainer.is_global_zero:
            self.save_grid()
        self._plot_batch = None

    def on_test_epoch_end(self) -> None:
        self._log_metric('test')

    def save_grid(self) -> Path | None:
        """The task's tiles of the first validation images: ``<run>/val_predictions/epochNNN-stepS.png``."""
        from torchvision.io import write_png
        from torchvision.utils import make_grid
        root = getattr(self.trainer, 'default_root_dir', None)
        if root is None:
            return None
        grid = make_grid(self.grid_tiles(self._plot_batch), nrow=self.grid_columns, padding=4, pad_value=255)
        out = Path(root) / 'val_predictions'
        out.mkdir(parents=True, exist_ok=True)
        path = out / f'epoch{self.current_epoch:03d}-step{self.global_step}.png'
        write_png(grid, str(path))
        return path

    # -- prediction --------------------------------------------------------------------------------------------
    def keep_prediction(self, prediction: dict) -> dict:
        """One image's prediction as ``zoo predict`` holds it until the writer runs (on the CPU)."""
        return {k: v.cpu() for k, v in prediction.items()}

    def predict_step(self, batch, batch_idx):
        x, targets = batch if isinstance(batch, (tuple, list)) else (batch, None)
        model = self.eval_model
        model.eval()
        predictions = model(x, targets)  # eval mode: the head's prediction, in each file's pixels
        return {'predictions': [self.keep_prediction(p) for p in predictions],
                'targets': image_metadata(targets) if targets is not None else [{} for _ in predictions]}


class DenseWriter(BasePredictionWriter):
    """``zoo predict``'s loop for a dense task (see the module docstring): :meth:`write` gets one image's prediction
    (file pixels), its metadata and the name it is written under; :meth:`summary` the line printed at the end."""

    def __init__(self, run_dir: str | Path):
        super().__init__(write_interval='epoch')
        self.run_dir = Path(run_dir)
        self.dataset = self.files = self.datamodule = None

    def path(self, folder: str, name: str) -> Path:
        """``<run>/<folder>/<name>``, its folder made (a name below ``--images DIR`` keeps its sub-folders)."""
        out = self.run_dir / folder / name
        out.parent.mkdir(parents=True, exist_ok=True)
        return out

    def default_name(self, index: int, meta: dict) -> str:
        """The picture's name when the images are the test split (not ``--images DIR``)."""
        return f'{index:06d}.png'

    def write(self, index: int, name: str, prediction: dict, meta: dict) -> None:
        raise NotImplementedError(f'{type(self).__name__} must define write (one image\'s prediction)')

    def summary(self, n: int) -> str:
        raise NotImplementedError(f'{type(self).__name__} must define summary')

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices) -> None:
        from .classification import predicted_dataset

        if not trainer.is_global_zero:
            return
        self.datamodule, self.dataset = trainer.datamodule, predicted_dataset(trainer)
        self.files = getattr(self.dataset, 'image_files', None)
        n = 0
        for batch in predictions:
            for prediction, meta in zip(batch['predictions'], batch['targets']):
                index = int(meta.get('index', n))
                name = self.files.names[index] if self.files is not None else self.default_name(index, meta)
                self.write(index, name, prediction, meta)
                n += 1
        tqdm.write(self.summary(n))
