"""The one door to oneDNN's fused CPU-inference kernels: ``linear``, ``conv_bn_act``, ``conv_add``, and
``compiled_linear_pass`` for inductor's frozen graphs (at the end of this file).

Every ``torch.ops.mkldnn`` call of the zoo lives in this module; blocks call these helpers and get the plain
modules' function (``nn.Linear``, ``nn.Conv2d``, eval ``nn.BatchNorm2d``, exact GELU) either way.

PyTorch runs an fp32 ``nn.Linear`` on the CPU through MKL's GEMM. oneDNN (which PyTorch also ships, and
uses for convolutions) has its own fp32 GEMM and can apply GELU to the output while it is still in cache
(a "post-op"), saving a pass over the largest activation of an MLP; a convolution can also add a residual
as a post-op. On the 2-core AMD EPYC development machine its GEMMs ran about 2x faster than MKL's for the
shapes of RaftMLP's and Strip-MLP's MLPs (docs/mlp.md); in eager the door made the token-mixing families
1.04-1.21x faster there and 1.01-1.30x on a 2-core Intel Xeon with AMX (docs/runtimes.md).

oneDNN wants weights in a blocked layout of its own and reorders plain weights on every call (for Strip-MLP's
2x2/s2 merging convolution at batch 1 the reorder costs more than the convolution). A module in eval mode
therefore keeps its prepared weight (BatchNorm or a scale folded, reordered; ``_prepared``), as inference
compilers do when they freeze weights. It is rebuilt when a weight or BN statistic is replaced or changed in
place (its version counter moves: ``load_state_dict``, an optimiser or EMA step, ``.to()``, ``with
torch.no_grad(): w.mul_(2)``) or when the input shape changes. A write through ``w.data`` bypasses the version
counter (PyTorch discourages it); call ``clear_prepared()`` after one. The cache holds one extra copy of the
weights while a model runs inference.

When the fast path runs: CPU, float32, PyTorch built with oneDNN, ``ZOO_ONEDNN`` not ``0``, and nobody is
looking at the graph. Under ``torch.compile``, ``torch.export`` / ONNX export (``torch.compiler.is_compiling``
and ``is_exporting``), ``torch.jit.trace``, ``torch.fx`` symbolic tracing and any dispatch mode (``FlopCounterMode``, fake tensors) the
helpers run the plain ops, so the compiler sees ``aten`` ops it can fuse and freeze, the exporters see ops
ONNX knows, and the FLOP counter counts every MAC whatever ``requires_grad`` says. oneDNN's fused ops have no
backward: with autograd, ``linear`` runs ``_Linear`` (oneDNN forward and input gradient) and GELU apart, the
convolutions the plain modules.

Self-test: the first time each kind of fused call runs in a process (linear, linear+GELU, conv, conv+GELU,
conv+add, the autograd linear), its result is compared with the plain ops' result on the same input. On a
mismatch or an error that kind warns once (``RuntimeWarning``) and runs the plain ops from then on, so a
oneDNN build that computes something else cannot silently change a model's outputs.

``ZOO_ONEDNN=0`` switches the fast path off (plain ops everywhere, and compiled graphs keep inductor's own
linears; read at each call, so it also serves A/B timing). Whether the eager fast path beats ``torch.compile``
of the plain modules depends on the CPU and the model; ``zoo bench`` measures both.
"""
from __future__ import annotations

import functools
import os
import warnings
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from ._torch_compat import custom_graph_pass, detect_fake_mode, dispatch_mode_active, is_fx_symbolic_tracing, \
    version_counter

__all__ = ['add_tokens', 'clear_prepared', 'compiled_linear_pass', 'conv_add', 'conv_bn_act', 'eager_inference',
           'exact_gelu', 'linear', 'onednn_enabled']


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


_is_exporting = getattr(torch.compiler, 'is_exporting', lambda: False)


def _graph_captured() -> bool:
    """Someone is capturing or inspecting the graph: torch.compile (dynamo), torch.export / ONNX export,
    torch.jit.trace, torch.fx symbolic tracing, or a dispatch mode (FlopCounterMode, fake tensors). They get the
    plain ops they know. ``is_compiling`` comes first: dynamo folds it to a constant and never traces the rest."""
    return (torch.compiler.is_compiling() or _is_exporting() or torch.jit.is_tracing() or is_fx_symbolic_tracing()
            or dispatch_mode_active())


def eager_inference() -> bool:
    """No autograd and nobody capturing the graph: eager-only tricks (``out=`` into a strided tensor, Python
    loops over the batch) may run. Under compile and export the plain form is traced instead (those tricks
    break dynamo's graph or pin the batch size)."""
    return not (torch.compiler.is_compiling() or torch.is_grad_enabled() or _graph_captured())


def _use_onednn(x: torch.Tensor, weight: torch.Tensor, grad: bool = False) -> bool:
    if torch.compiler.is_compiling() or is_fx_symbolic_tracing():  # before x's device: an fx Proxy has none
        return False
    return (x.device.type == 'cpu' and x.dtype == torch.float32 and weight.dtype == torch.float32
            and torch.is_grad_enabled() == grad and onednn_enabled() and not _graph_captured())


# ---- first-use self-test ------------------------------------------------------------------------------------

# kind of fused call -> True (checked, equal) or False (failed: plain ops from then on); absent: not yet run.
_CHECKED: dict[tuple[str, torch.dtype], bool] = {}


def _close(fast: torch.Tensor, plain: torch.Tensor) -> bool:
    """Equal to the dtype's rounding: max |fast - plain| <= rel * max |plain| (+ 1e-5), shapes equal; rel is 1e-4
    in float32, 4 eps in a lower precision (bfloat16 rounds at 2^-8 relative: two correct kernels differ there)."""
    if fast.shape != plain.shape:
        return False
    rel = max(1e-4, 4 * torch.finfo(plain.dtype).eps) if plain.dtype.is_floating_point else 1e-4
    return plain.numel() == 0 or bool((fast - plain).abs().float().max() <= rel * plain.abs().float().max() + 1e-5)


def _checked(kind: str, fast: Callable[[], torch.Tensor], plain: Callable[[], torch.Tensor],
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``fast()``, compared once per process, ``kind`` and ``dtype`` (the input's) with ``plain()``; after a
    mismatch or an error, a warning and ``plain()`` for good, for that kind and dtype."""
    key = (kind, dtype)
    state = _CHECKED.get(key)
    if state:
        return fast()
    if state is False:
        return plain()
    reference = plain()
    try:
        y = fast()
        why = None if _close(y.detach(), reference.detach()) else (
            f'max |difference| {(y.detach() - reference.detach()).abs().max().item():.3g} against a maximum '
            f'|value| of {reference.detach().abs().max().item():.3g}' if y.shape == reference.shape
            else f'shape {tuple(y.shape)} instead of {tuple(reference.shape)}')
    except Exception as error:  # noqa: BLE001 - any failure of a private kernel means: do not use it
        why = f'{type(error).__name__}: {error}'
    _CHECKED[key] = why is None
    if why is None:
        return y
    warnings.warn(f'zoo.layers.onednn: the oneDNN {kind} kernel does not compute the plain ops\' result ({why}); '
                  'running the plain PyTorch ops instead (set ZOO_ONEDNN=0 to skip oneDNN altogether)',
                  RuntimeWarning, stacklevel=3)
    return reference


# ---- prepared (reordered, folded) weights -------------------------------------------------------------------

# module -> (its tensors, their (address, version), input shape, prepared weights); one entry per module.
_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _prepared(owner: nn.Module, tensors: tuple, shape: tuple, make: Callable[[], tuple]) -> tuple:
    """``make()``, cached on ``owner`` until one of ``tensors`` is replaced or modified in place (its version
    counter moves), or the input shape changes. The cache sits beside the module (a weak-keyed dict), so
    state dicts, ``deepcopy`` and pickling never see it."""
    if any(t.is_inference() for t in tensors):  # made under inference_mode: no version counter to watch
        return make()
    state = tuple((t.data_ptr(), version_counter(t)) for t in tensors)
    hit = _PREPARED.get(owner)
    if hit is not None and hit[2] == shape and hit[1] == state and all(a is b for a, b in zip(hit[0], tensors)):
        return hit[3]
    value = make()
    _PREPARED[owner] = (tensors, state, shape, value)
    return value


def clear_prepared() -> None:
    """Forget every prepared weight (needed only after writing weights through ``.data``)."""
    _PREPARED.clear()


# ---- linear -------------------------------------------------------------------------------------------------

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
    (``_Linear``), GELU separate. Plain ``F.linear`` elsewhere (compile, export, counters, ``ZOO_ONEDNN=0``)."""
    if _use_onednn(x, layer.weight):
        attr, algorithm = ('gelu', 'none') if gelu else ('none', '')

        def fast():
            weight = layer.weight
            if not layer.training:  # reordered once for oneDNN (the layout does not depend on the token count)
                weight, = _prepared(layer, (weight,), (), lambda: (torch.ops.mkldnn._reorder_linear_weight(
                    layer.weight, x.numel() // x.shape[-1]),))
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, layer.bias, attr, [], algorithm)
        return _checked('linear+gelu' if gelu else 'linear', fast, lambda: _plain_linear(x, layer, gelu), x.dtype)
    if _use_onednn(x, layer.weight, grad=True):
        y = _checked('linear (autograd)', lambda: _Linear.apply(x.contiguous(), layer.weight, layer.bias),
                     lambda: F.linear(x, layer.weight, layer.bias), x.dtype)
        return F.gelu(y) if gelu else y
    return _plain_linear(x, layer, gelu)


def _plain_linear(x: torch.Tensor, layer: nn.Linear, gelu: bool) -> torch.Tensor:
    y = F.linear(x, layer.weight, layer.bias)
    return F.gelu(y) if gelu else y


def add_tokens(x: torch.Tensor, y: torch.Tensor, swap_hw: bool = False) -> torch.Tensor:
    """``x + y`` for (B, h, w, C) tokens, written in (B, h, w, C) memory order, or in (B, w, h, C) order with
    ``swap_hw`` (logically (B, h, w, C) either way), so that the next op reads its axis without a copy
    (RaftMLP's vertical mixing). Eager inference only; under autograd, compile, export and counters a plain
    ``x + y`` (the compiler picks its own layouts; ``out=`` into a strided tensor breaks dynamo's graph)."""
    if not eager_inference():
        return x + y
    b, h, w, c = x.shape
    out = x.new_empty(b, w, h, c).transpose(1, 2) if swap_hw else x.new_empty(b, h, w, c)
    return torch.add(x, y, out=out)


# ---- convolutions -------------------------------------------------------------------------------------------

def _conv_fusable(x: torch.Tensor, conv: nn.Conv2d, bn: nn.BatchNorm2d | None = None) -> bool:
    return (_use_onednn(x, conv.weight) and conv.padding_mode == 'zeros' and not isinstance(conv.padding, str)
            and (bn is None or (not bn.training and bn.running_var is not None and bn.affine)))


def _conv_args(conv: nn.Conv2d) -> tuple:
    return list(conv.padding), list(conv.stride), list(conv.dilation), conv.groups


def conv_bn_act(x: torch.Tensor, conv: nn.Conv2d, bn: nn.BatchNorm2d | None = None, gelu: bool = False) -> torch.Tensor:
    """``gelu(bn(conv(x)))`` (each part optional). In CPU inference (eval BN, no autograd) the BN is folded
    into the convolution's weights and the GELU runs as a oneDNN post-op: one pass instead of three."""
    def plain():
        y = conv(x) if bn is None else bn(conv(x))
        return F.gelu(y) if gelu else y

    if not _conv_fusable(x, conv, bn):
        return plain()
    xc = x if x.is_contiguous(memory_format=torch.channels_last) else x.contiguous()  # NCHW, or channels-last

    def fast():
        if conv.training:  # weights change every step: fold and let oneDNN reorder per call
            weight, bias = _fold(conv, bn)
        else:
            tensors = (conv.weight, conv.bias)
            if bn is not None:
                tensors += (bn.weight, bn.bias, bn.running_mean, bn.running_var)
            weight, bias = _prepared(conv, tuple(t for t in tensors if t is not None), tuple(xc.shape),
                                     lambda: _pack_conv(conv, *_fold(conv, bn), list(xc.shape)))
        attr, algorithm = ('gelu', 'none') if gelu else ('none', '')
        return torch.ops.mkldnn._convolution_pointwise(xc, weight, bias, *_conv_args(conv), attr, [], algorithm)
    return _checked('conv+gelu' if gelu else 'conv', fast, plain, x.dtype)


def conv_add(x: torch.Tensor, conv: nn.Conv2d, residual: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``residual + scale * conv(x)`` (``scale`` per output channel, optional). In CPU inference, for a 1x1
    convolution and a residual laid out as the output, the scale is folded into the convolution and the
    residual added as a oneDNN post-op, so the output takes no extra pass through memory (PoolFormer's MLP)."""
    def plain():
        y = conv(x)
        return residual + (y if scale is None else y * scale.view(1, -1, 1, 1))

    if not _conv_fusable(x, conv):
        return plain()
    xc = x if x.is_contiguous(memory_format=torch.channels_last) else x.contiguous()
    layout = torch.channels_last if xc.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
    if not (conv.kernel_size == (1, 1) and conv.stride == (1, 1) and tuple(conv.padding) == (0, 0)
            and residual.shape == (x.shape[0], conv.out_channels, *x.shape[2:]) and residual.dtype == x.dtype
            and residual.is_contiguous(memory_format=layout)):  # the post-op adds a tensor laid out as the output
        return plain()

    def fast():
        tensors = tuple(t for t in (conv.weight, conv.bias, scale) if t is not None)
        make = functools.partial(_fold_scale, conv, scale)
        weight, bias = make() if conv.training else _prepared(conv, tensors, tuple(xc.shape), make)
        return torch.ops.mkldnn._convolution_pointwise.binary(xc, residual, weight, bias, *_conv_args(conv), 'add',
                                                              1.0, None, [], None)
    return _checked('conv+add', fast, plain, x.dtype)


def _fold(conv: nn.Conv2d, bn: nn.BatchNorm2d | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight and bias of ``bn(conv(x))`` as one convolution (eval BN: a per-output-channel affine map)."""
    weight, bias = conv.weight, conv.bias
    if bn is not None:  # bn(y) = (y - mean) * weight / sqrt(var + eps) + bias, per output channel
        scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps)
        weight = weight * scale.view(-1, *([1] * (weight.ndim - 1)))
        bias = (-bn.running_mean if bias is None else bias - bn.running_mean) * scale + bn.bias
    return weight, bias


def _fold_scale(conv: nn.Conv2d, scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight and bias of ``scale * conv(x)`` as one convolution (plain layout: the binary post-op kernel
    is given oneDNN's own reorder, not a pre-packed weight)."""
    weight, bias = conv.weight, conv.bias
    if scale is not None:
        weight = weight * scale.view(-1, *([1] * (weight.ndim - 1)))
        bias = None if bias is None else bias * scale
    return weight.contiguous(), bias


def _pack_conv(conv: nn.Conv2d, weight: torch.Tensor, bias: torch.Tensor | None, input_size: list[int]) -> tuple:
    weight = torch.ops.mkldnn._reorder_convolution_weight(weight.contiguous(), list(conv.padding), list(conv.stride),
                                                          list(conv.dilation), conv.groups, input_size)
    return weight, bias


# ---- compiled graphs: oneDNN for inductor's frozen float32 linears ----------------------------------------------

_RESHAPES = ('reshape', 'view', '_unsafe_view')


def compiled_linear_pass():
    """An inductor graph pass (``torch._inductor.config.post_grad_custom_pre_pass``) that runs a frozen graph's
    float32 linears in oneDNN, or ``None`` when the fast path is off (``ZOO_ONEDNN=0``, no oneDNN ops).

    Why: with freezing and a static batch, inductor packs a float32 linear for MKL (``mkl::_mkl_linear``); with
    bfloat16, or a batch-symbolic graph, for oneDNN (``mkldnn::_linear_pointwise``), which also takes the bias
    and the following exact GELU as post-ops and works on N-d tokens without the flattening reshapes. On the
    2-core AMD EPYC development machine the oneDNN form made the compiled RaftMLP-S, TNT-S and Strip-MLP-T*
    1.04-1.30x faster, on a 2-core Intel Xeon with AMX 0.93-1.23x (TNT-S at batch 1 slower; docs/runtimes.md);
    nothing public selects it, hence this pass. It rewrites each
    ``mkl::_mkl_linear(x, packed, weight, bias, batch)`` into ``mkldnn::_linear_pointwise(x, weight reordered
    for oneDNN, bias)`` (over the tokens before inductor's flattening reshape, when the output is reshaped back
    to their shape), before inductor's own post-grad passes fuse the GELUs. The first rewrite of a process is
    checked against ``F.linear`` on the graph's real weight (``_checked``); on a mismatch or an error it warns
    and no graph is rewritten. A graph without MKL linears (bfloat16, convolution nets) is left as it is."""
    if not onednn_enabled():
        return None
    return _linear_pass()


@functools.cache
def _linear_pass():
    CustomGraphPass = custom_graph_pass()
    mkl_linear = getattr(getattr(torch.ops, 'mkl', None), '_mkl_linear', None)
    targets = () if mkl_linear is None else (mkl_linear, mkl_linear.default)  # the packet or its overload
    reshapes = tuple(getattr(torch.ops.aten, name).default for name in _RESHAPES)

    def reshape_of(node) -> bool:
        return isinstance(node, torch.fx.Node) and node.op == 'call_function' and node.target in reshapes

    class OneDNNLinears(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            gm = graph.owning_module
            nodes = [n for n in graph.nodes if n.op == 'call_function' and n.target in targets]
            if not nodes:
                return
            fake_mode = detect_fake_mode([n.meta.get('val') for n in nodes[:1]])
            if fake_mode is None:
                return
            for i, node in enumerate(nodes):
                try:  # everything that can fail comes before the graph is changed
                    x, _, weight_node, bias_node, batch = node.args
                    weight = getattr(gm, weight_node.target, None) if weight_node.op == 'get_attr' else None
                    bias = (getattr(gm, bias_node.target, None) if isinstance(bias_node, torch.fx.Node)
                            and bias_node.op == 'get_attr' else None)
                    if not isinstance(weight, torch.Tensor) or (bias_node is not None and bias is None):
                        continue  # not the frozen constants this pass knows: leave the node to MKL
                    packed = _packed_weight(weight, bias, batch)
                    if packed is None:  # the self-test failed: inductor's own linears from here on
                        break
                    out, users = node, list(node.users)
                    # reshape(tokens, (n, in)) -> linear -> reshape(.., (*tokens.shape[:-1], out)): one N-d linear
                    if reshape_of(x) and len(users) == 1 and reshape_of(users[0]) and \
                            tuple(x.args[0].meta['val'].shape[:-1]) == tuple(users[0].meta['val'].shape[:-1]):
                        x, out = x.args[0], users[0]
                except Exception as error:  # noqa: BLE001 - a graph this pass does not know: leave it to inductor
                    warnings.warn(f'zoo.layers.onednn: compiled_linear_pass left a linear to MKL '
                                  f'({type(error).__name__}: {error})', RuntimeWarning, stacklevel=2)
                    break
                name = f'_zoo_onednn_linear_{i}'
                gm.register_buffer(name, packed)  # a buffer: what a get_attr node may point at
                with graph.inserting_before(node):
                    packed_node = graph.get_attr(name)
                    # a constant has no symbolic sizes (a symbolic one reached dynamo's guards: IndexError)
                    packed_node.meta['val'] = fake_mode.from_tensor(packed, static_shapes=True)
                    new = graph.call_function(torch.ops.mkldnn._linear_pointwise.default,
                                              (x, packed_node, bias_node, 'none', [], ''))
                new.meta.update(out.meta)
                out.replace_all_uses_with(new)
                if out is not node:
                    graph.erase_node(out)
                graph.erase_node(node)
            graph.eliminate_dead_code()
            gm.recompile()

        def uuid(self) -> str:
            return 'zoo.layers.onednn.compiled_linear_pass/1'

    return OneDNNLinears()


def _packed_weight(weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    """``weight`` reordered for oneDNN linears of ``rows`` rows, or None after a failed self-test (``_checked``,
    kind 'compiled linear': the first one of a process compared with ``F.linear`` on that weight, warned once)."""
    key = ('compiled linear', torch.float32)
    if _CHECKED.get(key) is False:
        return None
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
    if key not in _CHECKED:
        x = torch.randn(8, weight.shape[1], generator=torch.Generator().manual_seed(0))
        _checked(key[0], lambda: torch.ops.mkldnn._linear_pointwise(x, packed, bias, 'none', [], ''),
                 lambda: F.linear(x, weight, bias))
    return packed if _CHECKED[key] else None
