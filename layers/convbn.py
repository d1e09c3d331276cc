"""Conv + BatchNorm with four modes: ``train``, ``eval``, ``deploy`` and ``tune``.

Paper: You et al., "Efficient ConvBN Blocks for Transfer Learning and Beyond" (ICLR 2024, arXiv
2305.11624). Official code: https://github.com/apple/ml-tune-mode-convbn; the same idea ships as
mmengine's ``turn_on_efficient_conv_bn_eval``.

With ``c = gamma / sqrt(running_var + eps)`` per output channel:

| mode   | forward                                                   | BN statistics | trained           |
|--------|-----------------------------------------------------------|---------------|-------------------|
| train  | ``bn(conv(x))``, batch statistics while ``module.training``| updated       | conv, gamma, beta |
| eval   | ``bn(conv(x))`` with running statistics                   | frozen        | conv, gamma, beta |
| deploy | ``conv'(x)``, ``w' = c w``, ``b' = beta + c (b - mean)`` folded once | folded | the folded conv |
| tune   | ``w'``, ``b'`` recomputed from conv and BN at every forward, one conv call | frozen | conv, gamma, beta |

Tune is the Eval function exactly (``c (w * x) = (c w) * x``), with the same gradients, but autograd no
longer keeps the conv output for BN's backward. Our tune path goes one step beyond mmengine's: a
custom autograd function keeps ``x``, the conv weight and ``c`` and rebuilds ``w'`` in backward, so the
folded weight is not stored either. Modes ``eval``/``tune``/``deploy`` are sticky: ``model.train()``
(which Lightning calls every epoch) does not switch BN back to batch statistics.

:func:`set_mode` switches every pair of a model: our :class:`ConvBN` blocks directly, and any other
``Conv -> BatchNorm`` pair (torchvision, timm) found by tracing with ``torch.fx``, whose forward is then
re-routed through :func:`conv_bn_forward` while parameters stay in their original modules (state dict
keys and optimizers are unchanged).
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ._registry import register
from ._torch_compat import BatchNormBase, ConvBase, conv_forward

__all__ = ['MODES', 'ConvBN', 'conv_bn_forward', 'fold_conv_bn', 'set_mode', 'tune_forward']

MODES = ('train', 'eval', 'deploy', 'tune')
_BN = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f'unknown ConvBN mode {mode!r}; expected one of {", ".join(MODES)}')
    return mode


def conv_weight(conv: nn.Module) -> torch.Tensor:
    """The weight the conv actually applies (``weight * Phi`` for a weighted conv)."""
    return conv.masked_weight() if hasattr(conv, 'masked_weight') else conv.weight


def folded_scale_bias(conv: ConvBase, bn: BatchNormBase) -> tuple[torch.Tensor, torch.Tensor]:
    """``c = gamma / sqrt(var + eps)`` and ``b' = beta + c (b - mean)``, differentiable in gamma, beta, b."""
    var, mean = bn.running_var, bn.running_mean
    scale = torch.rsqrt(var + bn.eps)
    if bn.weight is not None:
        scale = bn.weight * scale
    bias = conv.bias - mean if conv.bias is not None else -mean
    bias = scale * bias
    if bn.bias is not None:
        bias = bn.bias + bias
    return scale, bias


class _TunedConv(torch.autograd.Function):
    """``conv(x, w * c, b')`` that saves ``x``, ``w`` and ``c`` (not ``w * c``) and refolds in backward.

    Gradients: ``dw = c * dw'``, ``dc = sum(dw' * w)`` over each filter, ``db' = sum(dZ)``; autograd then
    carries ``dc`` and ``db'`` to gamma, beta and the conv bias.
    """

    @staticmethod
    def forward(ctx, x, weight, scale, bias, stride, padding, dilation, groups):
        shape = (-1,) + (1,) * (weight.ndim - 1)  # c per output channel: (Cout, 1, ..., 1)
        zeros = [0] * (weight.ndim - 2)
        out = torch.ops.aten.convolution(x, weight * scale.reshape(shape), bias, stride, padding, dilation,
                                         False, zeros, groups)
        ctx.save_for_backward(x, weight, scale)
        ctx.conf = (stride, padding, dilation, groups)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, scale = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conf
        shape = (-1,) + (1,) * (weight.ndim - 1)
        folded = weight * scale.reshape(shape)
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1] or ctx.needs_input_grad[2], ctx.needs_input_grad[3]]
        gx, gw_folded, gb = torch.ops.aten.convolution_backward(
            grad_out, x, folded, [folded.shape[0]], stride, padding, dilation, False, [0] * (weight.ndim - 2),
            groups, mask)
        gw = gw_folded * scale.reshape(shape) if ctx.needs_input_grad[1] else None
        gs = (gw_folded * weight).flatten(1).sum(1) if ctx.needs_input_grad[2] else None
        return gx, gw, gs, gb, None, None, None, None


def tune_forward(conv: ConvBase, bn: BatchNormBase, x: torch.Tensor) -> torch.Tensor:
    """Tune mode: one conv with the folded weight and bias, recomputed from the current parameters."""
    scale, bias = folded_scale_bias(conv, bn)
    if conv.padding_mode != 'zeros' or isinstance(conv.padding, str) or conv.transposed:
        # rare layouts: fold and let the conv do its own padding (autograd keeps w' as well, like mmengine)
        w = conv_weight(conv) * scale.reshape((-1,) + (1,) * (conv.weight.ndim - 1))
        return conv_forward(conv, x, w, bias)
    return _TunedConv.apply(x, conv_weight(conv), scale, bias, list(conv.stride), list(conv.padding),
                            list(conv.dilation), conv.groups)


def conv_bn_forward(conv: ConvBase, bn: BatchNormBase, x: torch.Tensor, mode: str | None = None) -> torch.Tensor:
    """One Conv+BN pair in ``mode`` (by default the mode :func:`set_mode` stored on ``bn``)."""
    mode = mode or getattr(bn, 'convbn_mode', 'train')
    if mode == 'tune':
        return tune_forward(conv, bn, x)
    y = conv(x)
    if mode == 'eval':  # running statistics whatever bn.training says
        return F.batch_norm(y, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
    return bn(y)


@torch.no_grad()
def fold_conv_bn(conv: ConvBase, bn: BatchNormBase) -> ConvBase:
    """Deploy mode: a plain ``nn.ConvNd`` computing ``bn(conv(x))`` with running statistics."""
    if bn.running_var is None:
        raise ValueError('deploy mode needs a BatchNorm with running statistics (track_running_stats=True)')
    ndim = conv.weight.ndim - 2
    w = conv_weight(conv)
    fused = _CONV[ndim](conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
                        conv.dilation, conv.groups, True, conv.padding_mode, device=w.device, dtype=w.dtype)
    scale, bias = folded_scale_bias(conv, bn)
    fused.weight.copy_(w * scale.reshape((-1,) + (1,) * (ndim + 1)))
    fused.bias.copy_(bias)
    return fused


@register('conv', 'convbn', example=dict(in_channels=4, out_channels=8, kernel_size=3, padding=1),
          example_input=(2, 4, 8, 8))
class ConvBN(nn.Module):
    """Conv followed by BatchNorm, in one of the modes train / eval / deploy / tune (You et al. 2024).

    ``conv_layer`` builds the convolution (``nn.Conv2d`` by default; a weighted conv or ``nn.Conv1d`` /
    ``nn.Conv3d`` work, the BatchNorm follows its dimensionality). Bias defaults to False (BN follows).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = False, conv_layer=None, eps: float = 1e-5, momentum: float = 0.1,
                 mode: str = 'train'):
        super().__init__()
        conv_layer = conv_layer or nn.Conv2d
        self.conv = conv_layer(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                               dilation=dilation, groups=groups, bias=bias)
        self.bn = _BN[self.conv.weight.ndim - 2](out_channels, eps=eps, momentum=momentum)
        self.mode = 'train'
        self.set_mode(mode)

    def set_mode(self, mode: str) -> 'ConvBN':
        _check_mode(mode)
        if self.mode == 'deploy' and mode != 'deploy':
            raise ValueError('this ConvBN is in deploy mode: BN is folded into the conv weights for good; '
                             'rebuild or reload the model to use another mode')
        if mode == 'deploy' and self.mode != 'deploy':
            self.conv = fold_conv_bn(self.conv, self.bn)
            self.bn = nn.Identity()
        self.mode = mode
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == 'deploy':
            return self.conv(x)
        return conv_bn_forward(self.conv, self.bn, x, self.mode)

    def extra_repr(self) -> str:
        return f'mode={self.mode!r}'


# ----------------------------------------------------------------------------------------------- set_mode


class _Tracer(torch.fx.Tracer):
    """Keeps our ConvBN blocks (and anything torch.fx keeps by default) as leaves."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, ConvBN) or super().is_leaf_module(m, qualname)


def _pair_forward(conv, bn, x):  # the graph calls this in place of `bn(conv(x))`
    return conv_bn_forward(conv, bn, x)


torch.fx.wrap('_pair_forward')


def find_conv_bn_pairs(model: nn.Module) -> tuple[torch.fx.GraphModule, list[tuple[str, str]]]:
    """Trace ``model`` and return the graph and the ``(conv, bn)`` module names of every foldable pair.

    A pair is a BatchNorm whose only input is a (non-transposed) conv whose output has no other user
    and which the graph calls only once (a shared conv or bn is left alone).
    """
    tracer = _Tracer()
    graph = tracer.trace(model)
    gm = torch.fx.GraphModule(tracer.root, graph)
    modules = dict(model.named_modules())
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == 'call_module':
            calls[node.target] = calls.get(node.target, 0) + 1
    pairs = []
    for node in list(graph.nodes):
        if node.op != 'call_module' or not isinstance(modules.get(node.target), BatchNormBase):
            continue
        src = node.args[0] if node.args else None
        if (len(node.args) != 1 or node.kwargs or not isinstance(src, torch.fx.Node) or src.op != 'call_module'
                or not isinstance(modules.get(src.target), ConvBase) or modules[src.target].transposed
                or len(src.users) != 1 or calls[src.target] != 1 or calls[node.target] != 1
                or modules[node.target].running_var is None):
            continue
        with graph.inserting_before(node):
            conv_n, bn_n = graph.get_attr(src.target), graph.get_attr(node.target)
            fused = graph.call_function(_pair_forward, (conv_n, bn_n, src.args[0]))
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        graph.erase_node(src)
        pairs.append((src.target, node.target))
    graph.lint()
    gm.recompile()
    return gm, pairs


def set_mode(model: nn.Module, mode: str) -> dict:
    """Put every Conv+BN pair of ``model`` in ``mode`` (``train``, ``eval``, ``deploy`` or ``tune``).

    Our :class:`ConvBN` blocks switch directly. Other pairs (plain ``nn.Conv*`` then ``nn.BatchNorm*``, as
    in torchvision and timm) are found by tracing ``model`` with torch.fx once; the model's forward is
    then the traced graph, with each pair calling :func:`conv_bn_forward`. In ``deploy`` those pairs are
    folded into plain convs (the BN becomes ``nn.Identity``) and the original forward is restored.
    A model that cannot be traced keeps its own forward (with a warning): only its ConvBN blocks switch.

    Returns counts: ``{'blocks': ..., 'traced_pairs': ..., 'other_bn': ...}``.
    """
    _check_mode(mode)
    blocks = [m for m in model.modules() if isinstance(m, ConvBN)]
    for block in blocks:
        block.set_mode(mode)
    inside = {id(m) for b in blocks for m in b.modules()}
    loose_bn = [m for m in model.modules() if isinstance(m, BatchNormBase) and id(m) not in inside]
    pairs: list[tuple[str, str]] = getattr(model, '_convbn_pairs', None)
    if pairs is None and loose_bn:
        try:
            gm, pairs = find_conv_bn_pairs(model)
        except Exception as e:  # data-dependent control flow etc.
            warnings.warn(f'set_mode: could not trace {type(model).__name__} with torch.fx ({type(e).__name__}: '
                          f'{e}); only its zoo ConvBN blocks were switched to {mode!r}')
            pairs = []
        else:
            if pairs:
                model.forward = gm.forward  # the graph shares the model's modules and parameters
                model._convbn_pairs = pairs
    pairs = pairs or []
    names = {id(m): n for n, m in model.named_modules()}
    paired = {bn for _, bn in pairs}
    other = [m for m in loose_bn if names.get(id(m)) not in paired]
    for conv_name, bn_name in pairs:
        bn = model.get_submodule(bn_name)
        if mode == 'deploy':
            conv = model.get_submodule(conv_name)
            _replace(model, conv_name, fold_conv_bn(conv, bn))
            _replace(model, bn_name, nn.Identity())
        else:
            bn.convbn_mode = mode
    if mode == 'deploy' and pairs:
        del model.forward, model._convbn_pairs  # back to the model's own forward, now with folded convs
    return {'blocks': len(blocks), 'traced_pairs': len(pairs), 'other_bn': len(other)}


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition('.')
    setattr(model.get_submodule(parent) if parent else model, child, new)
