"""Gaussian denoising: a Lightning system that trains any ``task='denoising'`` model (DnCNN, ...).

Clean batches come from the DataModule (e.g. :class:`zoo.datasets.PhotoPatchesDataModule`); this system
adds white Gaussian noise of standard deviation ``sigma`` (on the 0-255 scale), trains with the mean
squared error to the clean image and reports PSNR and SSIM (torchmetrics) on the held-out images.
Validation noise is drawn from a generator seeded by the batch index, so every epoch and every run sees
the same noisy inputs and the numbers compare. ``zoo predict`` writes the denoised images as grey PNGs
(:class:`DenoisedWriter`); with ``--images DIR`` the files are the noisy inputs, denoised as they are.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from tqdm import tqdm  # its write() prints above a running progress bar, not glued to its line
from torchmetrics.image import PeakSignalNoiseRatio, StructuralSimilarityIndexMeasure

from . import optim
from .system import ZooSystem

__all__ = ['Denoiser', 'DenoisedWriter', 'add_noise']


def add_noise(clean: torch.Tensor, sigma: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """``clean + sigma / 255 * N(0, 1)`` (images in [0, 1]; not clipped, as in DnCNN)."""
    noise = torch.randn(clean.shape, generator=generator, dtype=clean.dtype).to(clean.device)
    return clean + noise * (sigma / 255.0)


class Denoiser(ZooSystem):
    """Gaussian denoising of ``zoo.create(name, in_chans=..., **model_args)``.

    Args:
        name: a registered denoising model (``dncnn``, ``dncnn_tiny``).
        sigma: noise standard deviation on the 0-255 scale (25 is the usual benchmark).
        convbn_mode: put the model's Conv+BN pairs in this mode (``zoo.layers.convbn.set_mode``).
        Everything else: :class:`ZooSystem` (default Adam lr 1e-3; cosine to 1e-5 per step).
    """

    task = 'denoising'

    def __init__(self, name: str = 'dncnn', sigma: float = 25.0, convbn_mode: Optional[str] = None,
                 optimizer: OptimizerCallable = lambda params: torch.optim.Adam(params, lr=1e-3),
                 lr_scheduler: Optional[LRSchedulerCallable] = lambda opt: optim.WarmupCosine(opt, min_lr=1e-5),
                 **kwargs):
        if sigma <= 0:
            raise ValueError(f'sigma must be > 0 (0-255 scale), got {sigma}')
        # an exported graph has one input size ('auto' may choose one: it is measured at one size too)
        if kwargs.get('runtime', 'eager') not in ('eager', 'compile'):
            raise ValueError(f"--runtime {kwargs['runtime']} runs an ONNX graph of one image size, and denoising is "
                             f"evaluated on whole images of their own sizes; use --runtime compile (a graph per "
                             f"size) or eager")
        super().__init__(name, optimizer=optimizer, lr_scheduler=lr_scheduler, **kwargs)
        if convbn_mode is not None:
            from zoo.layers.convbn import set_mode
            set_mode(self.model, convbn_mode)
        self.block_choices = self.block_choices or {'conv_layer': 'standard'}
        if 'den' in self.model_args:
            self.block_choices['den'] = str(list(self.model_args['den']))
        self.val_psnr, self.test_psnr = PeakSignalNoiseRatio(data_range=1.0), PeakSignalNoiseRatio(data_range=1.0)
        self.val_ssim, self.test_ssim = (StructuralSimilarityIndexMeasure(data_range=1.0),
                                         StructuralSimilarityIndexMeasure(data_range=1.0))

    def training_step(self, clean, batch_idx):
        clean = clean[0] if isinstance(clean, (tuple, list)) else clean
        loss = F.mse_loss(self.model(add_noise(clean, self.hparams.sigma)), clean)
        self.log_train(loss)
        return loss

    def _evaluate(self, clean, batch_idx: int, split: str):
        clean = clean[0] if isinstance(clean, (tuple, list)) else clean
        noisy = add_noise(clean, self.hparams.sigma, torch.Generator().manual_seed(10_000 + batch_idx))
        out = self.eval_model(noisy)  # the EMA, or the network in zoo test --runtime's runtime
        psnr, ssim = (self.val_psnr, self.val_ssim) if split == 'val' else (self.test_psnr, self.test_ssim)
        psnr(out.clamp(0, 1), clean)
        ssim(out.clamp(0, 1), clean)
        self.log(f'{split}/loss', F.mse_loss(out, clean), on_step=False, on_epoch=True, batch_size=clean.shape[0],
                 sync_dist=True)
        self.log(f'{split}/psnr', psnr, on_step=False, on_epoch=True, prog_bar=True, batch_size=clean.shape[0])
        self.log(f'{split}/ssim', ssim, on_step=False, on_epoch=True, batch_size=clean.shape[0])

    def validation_step(self, clean, batch_idx):
        self._evaluate(clean, batch_idx, 'val')

    def test_step(self, clean, batch_idx):
        self._evaluate(clean, batch_idx, 'test')

    def predict_step(self, batch, batch_idx):
        """The denoised image: of an image file as it is (``--images DIR``: the file brings its own noise), else of
        the clean test image with the seeded noise validation adds."""
        from .classification import predicted_dataset

        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        if getattr(predicted_dataset(self.trainer), 'image_files', None) is None:
            x = add_noise(x, self.hparams.sigma, torch.Generator().manual_seed(10_000 + batch_idx))
        return self.eval_model(x)  # the EMA when there is one, as evaluation

    def prediction_writer(self, run_dir: Path) -> BasePredictionWriter:
        return DenoisedWriter(run_dir)


class DenoisedWriter(BasePredictionWriter):
    """``zoo predict`` for denoising: each denoised image as a grey PNG at its input's size,
    ``denoised/<path below DIR>.png`` for ``--images DIR`` (``denoised/<index>.png`` for the test split)."""

    def __init__(self, run_dir: str | Path):
        super().__init__(write_interval='batch')  # images of different sizes: one batch each, written as they come
        self.run_dir = Path(run_dir) / 'denoised'
        self.written = 0

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                           dataloader_idx=0) -> None:
        from torchvision.io import write_png

        from .classification import predicted_dataset

        files = getattr(predicted_dataset(trainer), 'image_files', None)
        for i, image in zip(batch_indices, prediction):
            path = self.run_dir / (files.names[i] if files is not None else f'{i:06d}.png')
            path.parent.mkdir(parents=True, exist_ok=True)
            write_png((image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu(), str(path))
            self.written += 1

    def on_predict_end(self, trainer, pl_module) -> None:
        tqdm.write(f'zoo predict: {self.written} denoised images in {self.run_dir}')
