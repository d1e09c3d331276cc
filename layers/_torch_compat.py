"""torch's private names that zoo relies on, in one place. ``tests/test_private_surface.py`` checks that each still
resolves and means what zoo assumes, naming the name and the torch version when one does not, so a torch upgrade
that moves one fails there, loudly, instead of silently changing behaviour; the same file fails if a private torch
name is used anywhere else in zoo.

This is the lowest layer (``zoo.layers`` imports only torch and einops), so every other layer imports torch's
private surface from here. Modules that load lazily (``torch._inductor``, ``torch._higher_order_ops``, the pytree
helpers) are imported inside the function that needs them, as the callers did: ``import zoo`` must not load
``torch._dynamo`` or inductor.

The one known exception: ``zoo/_factory.py``'s restricted unpickler names ``torch._utils._rebuild_tensor_v2``,
``_rebuild_parameter`` and ``_rebuild_parameter_with_state`` as strings. Those are not calls into torch: they are
the globals a ``torch.save`` pickle stream asks for, which the unpickler maps to zoo's own functions (no torch code
runs), so they must stay spelled as the file spells them.

Not Python names and so not here: operators of torch's dispatcher with a leading underscore
(``torch.ops.mkldnn._linear_pointwise``, ``torch.ops.mkl._mkl_linear``, ``aten::_unsafe_view``,
``aten::_scaled_dot_product_flash_attention_for_cpu``). ``zoo.layers.onednn`` is their one door: it asks for them
at run time (``_ops_available``), self-tests their results and falls back to the plain ops; ``zoo.eval.profile``
looks its attention operator up with a default.

A reliance on behaviour rather than a name stays with its caller: ``zoo._runtime._compiled`` gives each compiled
function a fresh code object because dynamo keeps its cache and recompile limit per code object.
"""
from __future__ import annotations

from torch.fx import _symbolic_trace
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd

try:  # without it, take the plain path whenever a counter could be listening (what the old fallback did)
    from torch.utils._python_dispatch import _get_current_dispatch_mode
except ImportError:  # pragma: no cover
    def _get_current_dispatch_mode():
        return True

__all__ = ['BatchNormBase', 'COMPILED_PREFIX', 'ConvBase', 'LoadStateDictHook', 'conv_forward', 'custom_graph_pass',
           'detect_fake_mode', 'dispatch_mode_active', 'drop_compiled_forward', 'higher_order_scan',
           'inductor_config', 'inductor_mode_options', 'is_fx_symbolic_tracing', 'set_last_lr',
           'set_state_dict_metadata', 'state_dict_metadata', 'tree_flatten', 'tree_unflatten', 'version_counter']

# torch has no public base class of all its batch norms (BatchNorm1d/2d/3d, SyncBatchNorm, the lazy ones) or of
# all its convolutions (ConvNd and ConvTransposeNd); isinstance checks and the conv-BN folding need exactly those.
BatchNormBase = _BatchNorm  # torch.nn.modules.batchnorm._BatchNorm
ConvBase = _ConvNd          # torch.nn.modules.conv._ConvNd

# ``torch.compile(model)`` returns an OptimizedModule that holds the model as its attribute ``_orig_mod``, so a
# state dict saved from a compiled model has every key under this prefix. Nothing public names it.
COMPILED_PREFIX = '_orig_mod.'


def is_fx_symbolic_tracing() -> bool:
    """``torch.fx`` symbolic tracing is under way (not ``torch.compile`` / ``torch.export``).

    Answers: is every input a ``torch.fx.Proxy`` without a concrete shape, device or dtype? (``symbolic_trace``
    and tracers built on ``torch.fx.Tracer``: torchvision's ``create_feature_extractor``, timm's FX feature
    tools.) Under it, input checks and the oneDNN door step aside and the plain ops are recorded. Private name:
    ``torch.fx._symbolic_trace.is_fx_symbolic_tracing`` (the flag ``Tracer.trace`` sets); torch has no public
    spelling of this question."""
    return _symbolic_trace.is_fx_symbolic_tracing()


def dispatch_mode_active() -> bool:
    """A ``TorchDispatchMode`` (``FlopCounterMode``, fake tensors, ...) is listening to the ops run now.

    Private name: ``torch.utils._python_dispatch._get_current_dispatch_mode``. torch has no public way to ask
    whether a dispatch mode is active; the oneDNN door must know, so that a counter sees the plain ops."""
    return _get_current_dispatch_mode() is not None


def detect_fake_mode(inputs):
    """The ``FakeTensorMode`` that ``inputs`` (a graph's ``meta['val']`` tensors) belong to, or None.

    Private name: ``torch._guards.detect_fake_mode``. An inductor graph pass that adds a constant must give it a
    fake value of the graph's own mode; torch offers no public accessor for that mode."""
    from torch._guards import detect_fake_mode as detect
    return detect(inputs)


def custom_graph_pass():
    """The base class of an inductor graph pass (``__call__(graph)`` and ``uuid()``, the key of the FX graph cache).

    Private name: ``torch._inductor.custom_graph_pass.CustomGraphPass``. Inductor's custom passes
    (``post_grad_custom_pre_pass``) are configured only through its private config; this is the class it expects
    for a pass that may be cached."""
    from torch._inductor.custom_graph_pass import CustomGraphPass
    return CustomGraphPass


def inductor_config():
    """Inductor's global config module (``freezing``, ``post_grad_custom_pre_pass``, ``patch(...)``).

    Private name: ``torch._inductor.config``. ``torch.compile(options=...)`` reaches some of it, but freezing
    passed there is ignored (torch 2.14) and a pass must be added after any the user set, so zoo patches the
    config itself (``zoo._runtime._compiled``)."""
    from torch._inductor import config
    return config


def inductor_mode_options(mode: str) -> dict:
    """The inductor options that ``torch.compile(mode=mode)`` stands for ('max-autotune', ...).

    Private name: ``torch._inductor.list_mode_options``. zoo passes options (not a mode) to ``torch.compile``, and
    ``torch.compile`` takes only one of the two; torch has no public table of what a mode means."""
    from torch._inductor import list_mode_options
    return list_mode_options(mode)


def tree_flatten(tree) -> tuple[list, object]:
    """A nest of tuples, lists and dicts as its leaves and the spec to rebuild it (``tree_unflatten``).

    Private name: ``torch.utils._pytree.tree_flatten``. torch (2.14) has no public pytree module; this is the one
    torch.export and torch.compile use, so it flattens model outputs as the exporters do."""
    from torch.utils._pytree import tree_flatten as flatten
    return flatten(tree)


def tree_unflatten(leaves, spec):
    """The nest ``tree_flatten`` gave ``spec`` for, rebuilt with ``leaves``.

    Private name: ``torch.utils._pytree.tree_unflatten`` (see ``tree_flatten``)."""
    from torch.utils._pytree import tree_unflatten as unflatten
    return unflatten(leaves, spec)


def higher_order_scan():
    """torch's ``scan`` operator: ``scan(combine_fn, init, xs)`` loops ``combine_fn(carry, x) -> (carry, y)``
    over the leading dimension of ``xs`` as one graph node (ONNX ``Scan`` on export).

    Private name: ``torch._higher_order_ops.scan.scan``, a prototype in torch 2.14 with no public spelling. The
    function itself is returned so that dynamo, tracing the caller, sees the operator it knows."""
    from torch._higher_order_ops.scan import scan
    return scan


def drop_compiled_forward(module) -> None:
    """Undo ``module.compile()`` on ``module`` alone (not its children): its calls run its eager ``forward`` again.

    Private name: ``nn.Module._compiled_call_impl``, where ``nn.Module.compile`` keeps the compiled call (and which
    ``deepcopy`` copies). torch has no public way to undo ``Module.compile``; a copy of a trained network that
    must run eagerly (latency, memory probes) needs one."""
    module._compiled_call_impl = None


def conv_forward(conv, x, weight, bias):
    """``conv``'s convolution of ``x`` with another ``weight`` and ``bias`` (its own stride, padding, padding mode,
    dilation and groups).

    Private name: ``nn.ConvNd._conv_forward``. The public ``F.conv*d`` take no ``padding_mode``; this method is
    where torch applies a non-zero padding mode before the convolution."""
    return conv._conv_forward(x, weight, bias)


def version_counter(tensor) -> int:
    """``tensor``'s version counter: it moves on every in-place change (``load_state_dict``, an optimiser step,
    ``w.mul_(2)`` under no_grad), so a cache keyed on it notices a changed weight.

    Private name: ``Tensor._version``. Autograd's own check of saved tensors uses it; torch has no public
    spelling."""
    return tensor._version


def set_last_lr(scheduler, lrs: list) -> None:
    """Make ``lrs`` what ``scheduler.get_last_lr()`` returns, after the learning rates were set outside ``step()``
    (a schedule sized once the run's length is known).

    Private name: ``LRScheduler._last_lr``, the list ``get_last_lr`` reads. torch sets it only in ``step()`` and
    ``__init__`` and has no public setter."""
    scheduler._last_lr = lrs


def state_dict_metadata(state_dict):
    """The module list ``nn.Module.state_dict`` attaches to a state dict (module name -> ``{'version': ...}``),
    or None (a re-keyed dict, safetensors).

    Private name: the state dict's attribute ``_metadata``; ``torch.save`` keeps it and ``load_state_dict`` passes
    it to each module. torch has no public accessor; it is the only record of which modules a file had."""
    return getattr(state_dict, '_metadata', None)


def set_state_dict_metadata(state_dict, metadata) -> None:
    """Attach ``metadata`` as ``state_dict``'s module list (``state_dict_metadata``), as ``nn.Module.state_dict``
    does. Private name: the attribute ``_metadata``."""
    state_dict._metadata = metadata


class LoadStateDictHook:
    """Mixin for an ``nn.Module`` subclass that rewrites its own entries of a state dict before torch loads them:
    define ``remap_state_dict(state_dict, prefix, error_msgs) -> bool`` (False: an error was appended, load
    nothing for this module).

    Private name: ``nn.Module._load_from_state_dict``, overridden here. It is the per-module step of
    ``load_state_dict`` that torch's own modules override for old layouts; the public
    ``register_load_state_dict_pre_hook`` runs inside it but cannot skip the module's loading after an error."""

    def remap_state_dict(self, state_dict, prefix: str, error_msgs: list) -> bool:
        """Rewrite this module's entries (keys ``prefix + name``) in place; False after appending an error."""
        return True

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        if self.remap_state_dict(state_dict, prefix, error_msgs):
            super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                          error_msgs)
