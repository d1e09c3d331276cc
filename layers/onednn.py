"""Linear layers and convolutions through oneDNN in CPU inference: ``linear``, ``conv_bn_act``.

PyTorch runs an fp32 ``nn.Linear`` on the CPU through MKL's GEMM. oneDNN (which PyTorch also ships, and
uses for convolutions) has its own fp32 GEMM and can apply GELU to the output while it is still in cache
(a "post-op"), saving a pass over the largest activation of an MLP. On the 2-core AMD EPYC development
machine its GEMMs ran about 2x faster than MKL's for the shapes of RaftMLP's and Strip-MLP's MLPs (measured
under load, to be confirmed on a quiet machine; docs/mlp.md). Same function, to float rounding: the tests
compare both paths.

Used only where it can be: CPU, float32, PyTorch built with oneDNN, and no dispatch mode active (so
``FlopCounterMode`` counts the plain ops). oneDNN's fused ops have no backward: with autograd, ``linear``
runs ``_Linear`` (oneDNN forward and input gradient) and GELU apart, ``conv_bn_act`` the plain modules.
Everything else, and every call when the environment sets ``ZOO_ONEDNN=0`` (for A/B timing), runs
``F.linear`` (+ ``F.gelu``).
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

__all__ = ['linear', 'conv_bn_act', 'onednn_enabled']


def onednn_enabled() -> bool:
    """oneDNN's fused linear is available and not switched off with ``ZOO_ONEDNN=0``."""
    return (os.environ.get('ZOO_ONEDNN', '1') != '0' and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, '_linear_pointwise'))


try:  # a private helper of PyTorch's; without it, take the plain path whenever a counter could be listening
    from torch.utils._python_dispatch import _get_current_dispatch_mode
except ImportError:  # pragma: no cover
    def _get_current_dispatch_mode():
        return True


def _traced() -> bool:
    """A dispatch mode is active (FlopCounterMode, fake tensors, ...): run the plain ops it knows how to count."""
    return _get_current_dispatch_mode() is not None


def _use_onednn(x: torch.Tensor, weight: torch.Tensor, grad: bool = False) -> bool:
    return (x.device.type == 'cpu' and x.dtype == torch.float32 and weight.dtype == torch.float32
            and torch.is_grad_enabled() == grad and onednn_enabled() and not _traced())


class _Linear(torch.autograd.Function):
    """``x @ weight.T + bias`` for training: oneDNN's GEMM for the output and the input gradient, MKL's
    (``mm`` with a transposed operand, no copy) for the weight gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, 'none', [], '')

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        g = grad.contiguous().view(-1, grad.shape[-1])                   # (tokens, out)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = torch.ops.mkldnn._linear_pointwise(g, weight.t().contiguous(), None, 'none', [], '').view(x.shape)
        if ctx.needs_input_grad[1]:
            gw = g.t().mm(x.view(-1, x.shape[-1]))                       # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g.sum(0)
        return gx, gw, gb


def linear(x: torch.Tensor, layer: nn.Linear, gelu: bool = False) -> torch.Tensor:
    """``layer(x)``, or ``F.gelu(layer(x))`` (exact, erf GELU) with ``gelu=True``; (..., in) -> (..., out).

    Inference: one oneDNN call, GELU fused. Autograd: oneDNN's GEMM forward and for the input gradient
    (``_Linear``), GELU separate. Plain ``F.linear`` elsewhere."""
    if _use_onednn(x, layer.weight):
        attr, algorithm = ('gelu', 'none') if gelu else ('none', '')
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), layer.weight, layer.bias, attr, [], algorithm)
    if _use_onednn(x, layer.weight, grad=True):
        y = _Linear.apply(x.contiguous(), layer.weight, layer.bias)
    else:
        y = F.linear(x, layer.weight, layer.bias)
    return F.gelu(y) if gelu else y


def conv_bn_act(x: torch.Tensor, conv: nn.Conv2d, bn: nn.BatchNorm2d | None = None, gelu: bool = False) -> torch.Tensor:
    """``gelu(bn(conv(x)))`` (each part optional). In CPU inference (eval BN, no autograd) the BN is folded
    into the convolution's weights and the GELU runs as a oneDNN post-op: one pass instead of three."""
    if not (_use_onednn(x, conv.weight) and conv.padding_mode == 'zeros' and not isinstance(conv.padding, str)
            and (bn is None or (not bn.training and bn.running_var is not None and bn.affine))):
        y = conv(x) if bn is None else bn(conv(x))
        return F.gelu(y) if gelu else y
    weight, bias = conv.weight, conv.bias
    if bn is not None:  # bn(y) = (y - mean) * weight / sqrt(var + eps) + bias, per output channel
        scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
        weight = weight * scale.view(-1, *([1] * (weight.ndim - 1)))
        bias = (-bn.running_mean if bias is None else bias - bn.running_mean) * scale + bn.bias
    attr, algorithm = ('gelu', 'none') if gelu else ('none', '')
    if not x.is_contiguous(memory_format=torch.channels_last):  # NCHW, or channels-last kept as it is
        x = x.contiguous()
    return torch.ops.mkldnn._convolution_pointwise(x, weight, bias, list(conv.padding), list(conv.stride),
                                                   list(conv.dilation), conv.groups, attr, [], algorithm)
