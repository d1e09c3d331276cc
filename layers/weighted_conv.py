"""Weighted convolution: every kernel multiplied by a fixed separable spatial density ``Phi``.

Paper: Cammarasana & Patanè, "Optimal Weighted Convolution for Classification and Denosing"
(arXiv 2505.24558); density search in "Optimal Density Functions for Weighted Convolution in Learning
Models" (arXiv 2505.24527). Official code: https://github.com/cammarasana123/weightedConvolution2.0

The density ``den`` has ``(k - 1) / 2`` entries, the outermost ring first. With
``alfa = [*den, 1, *reversed(den)]`` the mask is ``Phi = alfa`` (1D), ``alfa ⊗ alfa`` (2D) or
``alfa ⊗ alfa ⊗ alfa`` (3D), and the forward is one ordinary convolution with ``weight * Phi``.
``Phi`` is a buffer computed once, so the cost over ``nn.ConvNd`` is one weight-sized multiply.

Defaults differ from the official ``wConv1d/2d/3d`` on purpose: these classes keep ``nn.ConvNd``'s
signature and defaults, so they are drop-in replacements (``den`` of all ones, the default, gives
bit-identical outputs to ``nn.ConvNd``):

=============  ==================================  ========================================
               official ``wConv2d``                here (= ``nn.Conv2d``)
=============  ==================================  ========================================
padding        1                                   0
bias           False                               True
weight init    kaiming_normal_(fan_out, relu)      kaiming_uniform_(a=sqrt(5)); a host model
                                                   (ResNet, VGG, DnCNN) applies its own init
den            required, positional (4th)          keyword, default all ones
buffers        ``alfa`` (length k) and ``Phi``     ``den`` ((k - 1) / 2 values) and ``Phi``
=============  ==================================  ========================================

To reproduce an official layer pass ``padding=1, bias=False`` (and the den). Official state dicts
load directly: ``alfa`` is turned into ``den`` (its first (k - 1) / 2 entries, checked to be the
symmetric profile with centre 1) and ``Phi`` is rebuilt where a checkpoint lacks it (the trainable
variant stores only ``den``). ``trainable_den=True`` makes ``den`` a per-layer parameter (the
repository's ``wConv_Trainable`` variant; the papers keep one fixed ``den`` for all layers).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ._registry import register
from ._torch_compat import LoadStateDictHook, conv_forward

__all__ = ['density_mask', 'WeightedConv1d', 'WeightedConv2d', 'WeightedConv3d', 'weighted_conv', 'conv_factory']


def _alfa(den: torch.Tensor) -> torch.Tensor:
    """``[d_0, ..., d_m, 1, d_m, ..., d_0]``: the symmetric 1-D profile with the centre fixed to 1."""
    return torch.cat([den, den.new_ones(1), den.flip(0)])


def density_mask(den: Sequence[float] | torch.Tensor, ndim: int = 2) -> torch.Tensor:
    """The separable mask ``Phi`` of a density vector (outermost ring first), shape ``(k,) * ndim``."""
    den = torch.as_tensor(den, dtype=torch.float32) if not isinstance(den, torch.Tensor) else den
    if den.ndim != 1:
        raise ValueError(f'den must be a 1-D sequence of (k - 1) / 2 values, got shape {tuple(den.shape)}')
    alfa = _alfa(den)
    phi = alfa
    for _ in range(ndim - 1):
        phi = phi[..., None] * alfa  # (k, ..., k) outer product, one more axis each time
    return phi


class _WeightedConvNd(LoadStateDictHook):
    """Shared by the 1D/2D/3D classes (mixed in before ``nn.ConvNd``, whose signature it keeps)."""

    _ndim: int

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = 'zeros', den=None,
                 trainable_den: bool = False, device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device=device, dtype=dtype)
        self._init_density(den, trainable_den)

    def _init_density(self, den, trainable_den: bool) -> None:
        k = self.kernel_size
        if len(set(k)) != 1 or k[0] % 2 == 0:
            raise ValueError(f'{type(self).__name__} supports odd isotropic kernels only (3, 5, 7, ...), got '
                             f'kernel_size={k if len(k) > 1 else k[0]}; use nn.Conv{self._ndim}d for others')
        n = (k[0] - 1) // 2
        den = torch.ones(n) if den is None else torch.as_tensor(den, dtype=torch.float32).flatten()
        if den.numel() != n:
            raise ValueError(f'a {k[0]}-wide kernel needs den with {n} value(s) (outermost ring first), '
                             f'got {den.numel()}: {den.tolist()}')
        self.trainable_den = trainable_den
        if trainable_den:
            self.den = nn.Parameter(den.clone())
        else:
            self.register_buffer('den', den.clone())
            self.register_buffer('Phi', density_mask(den, self._ndim))  # (k,) * ndim, broadcast over (Cout, Cin/g)

    def remap_state_dict(self, state_dict, prefix: str, error_msgs: list) -> bool:
        """Accept the official layout: ``alfa`` (the whole 1-D profile) instead of ``den``, ``Phi`` optional."""
        alfa = state_dict.pop(prefix + 'alfa', None)
        if alfa is not None and prefix + 'den' not in state_dict:
            n = (self.kernel_size[0] - 1) // 2
            den = alfa[:n]
            if alfa.numel() != 2 * n + 1 or not torch.equal(alfa, _alfa(den)):
                error_msgs.append(f'{prefix}alfa must be the symmetric profile [den, 1, reversed(den)] of '
                                  f'length {2 * n + 1}, got {alfa.tolist()}')
                return False
            state_dict[prefix + 'den'] = den.clone()
        den = state_dict.get(prefix + 'den')
        if self.trainable_den:
            state_dict.pop(prefix + 'Phi', None)  # rebuilt from the parameter at every forward
        elif den is not None and prefix + 'Phi' not in state_dict:
            state_dict[prefix + 'Phi'] = density_mask(den.float(), self._ndim)
        return True

    def masked_weight(self) -> torch.Tensor:
        """``weight * Phi`` (rebuilt from the parameter ``den`` when it is trainable)."""
        phi = density_mask(self.den, self._ndim) if self.trainable_den else self.Phi
        return self.weight * phi.to(self.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv_forward(self, x, self.masked_weight(), self.bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f', den={[round(v, 4) for v in self.den.tolist()]}' + \
            (', trainable_den=True' if self.trainable_den else '')


_EXAMPLE = dict(in_channels=4, out_channels=8, kernel_size=3, padding=1, den=[0.7])


@register('conv', 'weighted1d', layout='any', example=_EXAMPLE, example_input=(2, 4, 16))
class WeightedConv1d(_WeightedConvNd, nn.Conv1d):
    """Weighted 1-D convolution (Cammarasana & Patanè 2025): ``conv1d(x, weight * alfa)``."""
    _ndim = 1


@register('conv', 'weighted', example=_EXAMPLE, example_input=(2, 4, 8, 8))
class WeightedConv2d(_WeightedConvNd, nn.Conv2d):
    """Weighted 2-D convolution (Cammarasana & Patanè 2025): ``conv2d(x, weight * (alfa ⊗ alfa))``."""
    _ndim = 2


@register('conv', 'weighted3d', layout='any', example=_EXAMPLE, example_input=(2, 4, 6, 6, 6))
class WeightedConv3d(_WeightedConvNd, nn.Conv3d):
    """Weighted 3-D convolution (Cammarasana & Patanè 2025): ``conv3d(x, weight * (alfa ⊗ alfa ⊗ alfa))``."""
    _ndim = 3


def weighted_conv(in_channels: int, out_channels: int, kernel_size: int, *, den=None, trainable_den: bool = False,
                  ndim: int = 2, **kw) -> nn.Module:
    """A host's conv factory with one shared density (the papers' setting).

    ``den`` is one list for the model's 3x3 convs, or a dict ``{kernel_size: den}``. A kernel size without
    a density (1x1 shortcuts, a 7x7 stem when only a 3x3 density is given) gets a standard convolution,
    which is what a density of ones computes anyway.
    """
    std = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[ndim - 1]
    wcls = (WeightedConv1d, WeightedConv2d, WeightedConv3d)[ndim - 1]
    if isinstance(den, dict):
        den_k = den.get(kernel_size, den.get(str(kernel_size)))
    elif den is not None and len(den) == (kernel_size - 1) // 2:
        den_k = den
    else:
        den_k = None
    if kernel_size == 1 or (den_k is None and not trainable_den):
        return std(in_channels, out_channels, kernel_size, **kw)
    return wcls(in_channels, out_channels, kernel_size, den=den_k, trainable_den=trainable_den, **kw)


def conv_factory(conv_layer='standard', den=None, trainable_den: bool = False, ndim: int = 2):
    """The convolution constructor a host passes to its blocks: ``'standard'``, ``'weighted'`` or any conv spec.

    ``'weighted'`` uses :func:`weighted_conv` with the shared ``den``; a class or partial is used as given.
    """
    from functools import partial
    from ._registry import get
    if conv_layer in (None, 'standard'):
        if den is not None or trainable_den:
            raise ValueError("den and trainable_den apply to conv_layer='weighted'; got conv_layer='standard'")
        return (nn.Conv1d, nn.Conv2d, nn.Conv3d)[ndim - 1]
    if conv_layer == 'weighted':
        return partial(weighted_conv, den=den, trainable_den=trainable_den, ndim=ndim)
    if den is not None or trainable_den:
        raise ValueError(f"den and trainable_den apply to conv_layer='weighted'; got conv_layer={conv_layer!r}")
    return get('conv', conv_layer)
