"""Linear layers and convolutions through oneDNN in CPU inference: ``linear``, ``conv_bn_act``.

PyTorch runs an fp32 ``nn.Linear`` on the CPU through MKL's GEMM. oneDNN (which PyTorch also ships, and
uses for convolutions) has its own fp32 GEMM and can apply GELU to the output while it is still in cache
(a "post-op"), saving a pass over the largest activation of an MLP. On the 2-core AMD EPYC development
machine its GEMMs ran about 2x faster than MKL's for the shapes of RaftMLP's and Strip-MLP's MLPs
(docs/mlp.md). Same function, to float rounding: the tests compare both paths.

oneDNN wants weights in a blocked layout of its own and reorders plain weights on every call (for Strip-MLP's
2x2/s2 merging convolution at batch 1 the reorder costs more than the convolution). A module in eval mode
therefore keeps its prepared weight (BatchNorm folded, reordered; ``_prepared``), as inference compilers do
when they freeze weights. It is rebuilt when a weight or BN statistic is replaced or changed in place (its
version counter moves: ``load_state_dict``, an optimiser or EMA step, ``.to()``, ``with torch.no_grad():
w.mul_(2)``) or when the input shape changes. A write through ``w.data`` bypasses the version counter
(PyTorch discourages it); call ``clear_prepared()`` after one. The cache holds one extra copy of the weights
while a model runs inference.

Used only where it can be: CPU, float32, PyTorch built with oneDNN, and no dispatch mode active (so
``FlopCounterMode`` counts the plain ops). oneDNN's fused ops have no backward: with autograd, ``linear``
runs ``_Linear`` (oneDNN forward and input gradient) and GELU apart, ``conv_bn_act`` the plain modules.
Everything else, and every call when the environment sets ``ZOO_ONEDNN=0`` (for A/B timing), runs
``F.linear`` (+ ``F.gelu``) and the modules.
"""
from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

__all__ = ['linear', 'conv_bn_act', 'onednn_enabled', 'exact_gelu', 'clear_prepared']


@functools.cache
def _ops_available() -> bool:
    """This PyTorch has oneDNN's fused ops and weight reorders (fixed for the process: asked once)."""
    return torch.backends.mkldnn.is_available() and all(
        hasattr(torch.ops.mkldnn, op) for op in ('_linear_pointwise', '_convolution_pointwise',
                                                 '_reorder_linear_weight', '_reorder_convolution_weight'))


def onednn_enabled() -> bool:
    """oneDNN's fused ops and weight reorders are available and not switched off with ``ZOO_ONEDNN=0``."""
    return os.environ.get('ZOO_ONEDNN', '1') != '0' and _ops_available()


def exact_gelu(act: nn.Module) -> bool:
    """``act`` is ``nn.GELU`` with the erf form: the GELU oneDNN applies as a post-op (a subclass or the tanh
    approximation would compute another function)."""
    return type(act) is nn.GELU and act.approximate == 'none'


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


# module -> (its tensors, their (address, version), input shape, prepared weights); one entry per module.
_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _prepared(owner: nn.Module, tensors: tuple, shape: tuple, make: Callable[[], tuple]) -> tuple:
    """``make()``, cached on ``owner`` until one of ``tensors`` is replaced or modified in place (its version
    counter moves), or the input shape changes. The cache sits beside the module (a weak-keyed dict), so
    state dicts, ``deepcopy`` and pickling never see it."""
    state = tuple((t.data_ptr(), t._version) for t in tensors)
    hit = _PREPARED.get(owner)
    if hit is not None and hit[2] == shape and hit[1] == state and all(a is b for a, b in zip(hit[0], tensors)):
        return hit[3]
    value = make()
    _PREPARED[owner] = (tensors, state, shape, value)
    return value


def clear_prepared() -> None:
    """Forget every prepared weight (needed only after writing weights through ``.data``)."""
    _PREPARED.clear()


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
        weight = layer.weight
        if not layer.training:  # reordered once for oneDNN (the layout does not depend on the token count)
            weight, = _prepared(layer, (weight,), (), lambda: (torch.ops.mkldnn._reorder_linear_weight(
                layer.weight, x.numel() // x.shape[-1]),))
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, layer.bias, attr, [], algorithm)
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
    if not x.is_contiguous(memory_format=torch.channels_last):  # NCHW, or channels-last kept as it is
        x = x.contiguous()
    if conv.training:  # weights change every step: fold and let oneDNN reorder per call
        weight, bias = _fold(conv, bn)
    else:
        tensors = (conv.weight, conv.bias)
        if bn is not None:
            tensors += (bn.weight, bn.bias, bn.running_mean, bn.running_var)
        weight, bias = _prepared(conv, tuple(t for t in tensors if t is not None), tuple(x.shape),
                                 lambda: _pack_conv(conv, bn, list(x.shape)))
    attr, algorithm = ('gelu', 'none') if gelu else ('none', '')
    return torch.ops.mkldnn._convolution_pointwise(x, weight, bias, list(conv.padding), list(conv.stride),
                                                   list(conv.dilation), conv.groups, attr, [], algorithm)


def _fold(conv: nn.Conv2d, bn: nn.BatchNorm2d | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight and bias of ``bn(conv(x))`` as one convolution (eval BN: a per-output-channel affine map)."""
    weight, bias = conv.weight, conv.bias
    if bn is not None:  # bn(y) = (y - mean) * weight / sqrt(var + eps) + bias, per output channel
        scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
        weight = weight * scale.view(-1, *([1] * (weight.ndim - 1)))
        bias = (-bn.running_mean if bias is None else bias - bn.running_mean) * scale + bn.bias
    return weight, bias


def _pack_conv(conv: nn.Conv2d, bn: nn.BatchNorm2d | None, input_size: list[int]) -> tuple:
    weight, bias = _fold(conv, bn)
    weight = torch.ops.mkldnn._reorder_convolution_weight(weight.contiguous(), list(conv.padding), list(conv.stride),
                                                          list(conv.dilation), conv.groups, input_size)
    return weight, bias
