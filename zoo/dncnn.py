"""DnCNN: a residual denoiser that predicts the noise and subtracts it.

Paper: Zhang, Zuo, Chen, Meng, Zhang, "Beyond a Gaussian Denoiser: Residual Learning of Deep CNN for
Image Denoising" (IEEE TIP 2017, arXiv 1608.03981). Official code: https://github.com/cszn/DnCNN
(PyTorch in https://github.com/cszn/KAIR). DnCNN-S: 17 layers of 3x3 convolutions, 64 channels:
Conv+ReLU, 15 x (Conv+BN+ReLU), Conv; the middle and last convs have no bias. 556,096 parameters for
grayscale images.

The weighted-convolution paper (Cammarasana & Patanè 2025) reports DnCNN with ``conv_layer='weighted'``
(one ``den`` for every 3x3 conv). The 15 Conv+BN pairs are :class:`zoo.layers.convbn.ConvBN` blocks.
"""
from __future__ import annotations

import torch
from torch import nn

from zoo.layers.convbn import ConvBN
from zoo.layers.weighted_conv import conv_factory

from ._builder import build_model, check_image
from ._registry import register_model

__all__ = ['DnCNN']


class DnCNN(nn.Module):
    """DnCNN (Zhang et al. 2017): ``forward(noisy) = noisy - body(noisy)``."""

    def __init__(self, depth: int = 17, channels: int = 64, in_chans: int = 1, kernel_size: int = 3,
                 conv_layer='standard', den=None, trainable_den: bool = False, convbn_mode: str = 'train'):
        super().__init__()
        if depth < 3:
            raise ValueError(f'DnCNN needs depth >= 3 (first conv, at least one Conv+BN, last conv), got {depth}')
        conv, pad = conv_factory(conv_layer, den, trainable_den), kernel_size // 2
        self.in_chans = in_chans
        body = [conv(in_chans, channels, kernel_size, padding=pad, bias=True), nn.ReLU(inplace=True)]
        for _ in range(depth - 2):
            body += [ConvBN(channels, channels, kernel_size, 1, pad, conv_layer=conv, mode=convbn_mode),
                     nn.ReLU(inplace=True)]
        body.append(conv(channels, in_chans, kernel_size, padding=pad, bias=False))
        self.body = nn.Sequential(*body)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode='fan_in', nonlinearity='relu')
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def predict_noise(self, x: torch.Tensor) -> torch.Tensor:
        check_image(x, self.in_chans, 1, type(self).__name__)
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - self.predict_noise(x)  # residual learning: the body estimates the noise


_DNCNN = dict(family='dncnn', task='denoising', paper='https://arxiv.org/abs/1608.03981',
              repo='https://github.com/cszn/DnCNN', input_size=(1, 40, 40),
              capabilities=('tune_mode', 'weighted_conv'), tiny='dncnn_tiny')


@register_model(**_DNCNN, params=556_096)
def dncnn(**kwargs):
    """DnCNN-S: 17 layers, 64 channels (grayscale; ``in_chans=3`` for colour)."""
    return build_model(DnCNN, dict(depth=17, channels=64), kwargs)


@register_model(**{**_DNCNN, 'input_size': (1, 16, 16)})
def dncnn_tiny(**kwargs):
    """A CPU-sized DnCNN for tests: 5 layers, 16 channels."""
    return build_model(DnCNN, dict(depth=5, channels=16), kwargs)
