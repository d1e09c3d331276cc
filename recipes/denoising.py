"""Gaussian denoising: a Lightning system that trains any ``task='denoising'`` model (DnCNN, ...).

Clean batches come from the DataModule (e.g. :class:`zoo.datasets.PhotoPatchesDataModule`); this system
adds white Gaussian noise of standard deviation ``sigma`` (on the 0-255 scale), trains with the mean
squared error to the clean image and reports PSNR and SSIM (torchmetrics) on the held-out images.
Validation noise is drawn from a generator seeded by the batch index, so every epoch and every run sees
the same noisy inputs and the numbers compare.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torchmetrics.image import PeakSignalNoiseRatio, StructuralSimilarityIndexMeasure

import zoo

from . import optim
from .classification import block_choices, require_task

__all__ = ['Denoiser', 'add_noise']


def add_noise(clean: torch.Tensor, sigma: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """``clean + sigma / 255 * N(0, 1)`` (images in [0, 1]; not clipped, as in DnCNN)."""
    noise = torch.randn(clean.shape, generator=generator, dtype=clean.dtype).to(clean.device)
    return clean + noise * (sigma / 255.0)


class Denoiser(LightningModule):
    """Gaussian denoising of ``zoo.create(name, in_chans=..., **model_args)``.

    Args:
        name: a registered denoising model (``dncnn``, ``dncnn_tiny``).
        model_args: passed to ``zoo.create`` (``{'conv_layer': 'weighted', 'den': [0.7]}``).
        sigma: noise standard deviation on the 0-255 scale (25 is the usual benchmark).
        lr, weight_decay: Adam with a per-step cosine decay to ``min_lr``.
        convbn_mode: put the model's Conv+BN pairs in this mode (``zoo.layers.convbn.set_mode``).
    """

    monitor, monitor_mode = 'val/psnr', 'max'

    def __init__(self, name: str = 'dncnn', model_args: dict | None = None, in_chans: int | None = None,
                 sigma: float = 25.0, lr: float = 1e-3, weight_decay: float = 0.0, min_lr: float = 1e-5,
                 convbn_mode: str | None = None):
        super().__init__()
        if sigma <= 0:
            raise ValueError(f'sigma must be > 0 (0-255 scale), got {sigma}')
        require_task(name, 'denoising', 'Denoiser')
        self.save_hyperparameters()
        self.model = zoo.create(name, in_chans=in_chans, **(model_args or {}))
        if convbn_mode is not None:
            from zoo.layers.convbn import set_mode
            set_mode(self.model, convbn_mode)
        self.model_name = name
        self.block_choices = block_choices(model_args) or {'conv_layer': 'standard'}
        if model_args and 'den' in model_args:
            self.block_choices['den'] = str(list(model_args['den']))
        self.val_psnr, self.test_psnr = PeakSignalNoiseRatio(data_range=1.0), PeakSignalNoiseRatio(data_range=1.0)
        self.val_ssim, self.test_ssim = (StructuralSimilarityIndexMeasure(data_range=1.0),
                                         StructuralSimilarityIndexMeasure(data_range=1.0))

    def forward(self, noisy: torch.Tensor) -> torch.Tensor:
        return self.model(noisy)

    def training_step(self, clean, batch_idx):
        clean = clean[0] if isinstance(clean, (tuple, list)) else clean
        loss = F.mse_loss(self.model(add_noise(clean, self.hparams.sigma)), clean)
        if not torch.isfinite(loss):
            raise FloatingPointError(f'training loss is {loss.item()} at step {self.global_step}; lower the lr')
        self.log('train/loss', loss, on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def _evaluate(self, clean, batch_idx: int, split: str):
        clean = clean[0] if isinstance(clean, (tuple, list)) else clean
        noisy = add_noise(clean, self.hparams.sigma, torch.Generator().manual_seed(10_000 + batch_idx))
        out = self.model(noisy)
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

    def predict_step(self, clean, batch_idx):
        clean = clean[0] if isinstance(clean, (tuple, list)) else clean
        return self.model(add_noise(clean, self.hparams.sigma, torch.Generator().manual_seed(10_000 + batch_idx)))

    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.Adam(optim.param_groups(self.model, hp.weight_decay), lr=hp.lr)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        sched = optim.scheduler(opt, total, floor=hp.min_lr / hp.lr)
        return {'optimizer': opt, 'lr_scheduler': {'scheduler': sched, 'interval': 'step'}}
