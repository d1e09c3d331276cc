"""Runtimes: run or save any zoo model through ``torch.compile``, ``torch.export``, ONNX Runtime or OpenVINO.

>>> fast = zoo.optimize(zoo.create('poolformer_s12'), 'compile')          # inductor with freezing
>>> ort = zoo.optimize(model, 'onnxruntime', example=torch.randn(2, 3, 224, 224))
>>> zoo.export(model, 'poolformer_s12.onnx', torch.randn(2, 3, 224, 224))   # dynamic batch
>>> zoo.export(detector, 'det.onnx', x, nms=True)                            # decode + NMS in the graph

What is captured: a classifier, denoiser or language model is captured whole. A dense model (anything with
``forward_raw`` and ``head.predict``: every detector) is captured as its network, ``forward_raw`` (backbone, neck,
head convolutions); its prediction (decode, NMS, inverse letterbox) then runs eagerly on the captured graph's maps,
so ``optimize(det, rt)(x, metas)`` returns the same detections as ``det.eval()(x, metas)``. ``export(...,
nms=True)`` instead puts the head's deployable prediction in the graph (``head.detections``: decode and
class-aware NMS, the function ``head.predict`` calls eagerly), with a fixed number of rows per image, so the file
is deployable on its own. No NMS is written here: the head owns it.

ONNX export is ``torch.onnx.export(..., dynamo=True)`` (the exporter built on ``torch.export``), with the batch
dimension dynamic. ONNX Runtime and OpenVINO come from the ``export`` extra (``pip install 'zoo[export]'``).
Nothing here is imported by ``import zoo``: torch._dynamo, onnx and onnxruntime load on first use.
"""
from __future__ import annotations

import contextlib
import importlib.util
import pathlib
import tempfile
from typing import Callable

import torch
from torch import nn

from . import tasks
from .tasks import example_input

__all__ = ['RUNTIMES', 'export', 'optimize']

RUNTIMES = ('eager', 'compile', 'onnxruntime', 'openvino', 'onnxruntime-int8', 'openvino-int8', 'auto')
FORMATS = ('onnx', 'pt2')
_NEEDS = {'onnxruntime': ('onnxruntime', 'onnx', 'onnxscript'), 'openvino': ('openvino', 'onnx', 'onnxscript'),
          'onnxruntime-int8': ('onnxruntime', 'onnx', 'onnxscript'),
          'openvino-int8': ('openvino', 'nncf', 'onnx', 'onnxscript'), 'onnx': ('onnx', 'onnxscript')}


def _missing(what: str) -> list[str]:
    """The packages runtime (or format) ``what`` needs that are not installed."""
    return [m for m in _NEEDS.get(what, ()) if importlib.util.find_spec(m) is None]


def _require(what: str) -> None:
    """One-line error naming the extra when a runtime's package is missing."""
    missing = _missing(what)
    if missing:
        raise ValueError(f"{what} needs {', '.join(missing)}: pip install 'zoo[export]'")


def check_runtime(runtime: str, message: str = 'unknown runtime {runtime!r}; expected one of {runtimes}') -> str:
    """``runtime`` if it is one of :data:`RUNTIMES`, else a one-line ``ValueError`` (``message``, then the close
    match): the one check of every place a runtime is named (``zoo.optimize``, ``zoo bench|profile|test
    --runtime``, the systems), so each suggests ``onnxruntime`` for ``onnx``."""
    if runtime not in RUNTIMES:
        import difflib
        # cutoff 0.5, not difflib's 0.6: 'onnx' is 0.53 from 'onnxruntime'
        close = difflib.get_close_matches(str(runtime), RUNTIMES, n=1, cutoff=0.5)
        raise ValueError(message.format(runtime=runtime, runtimes=', '.join(RUNTIMES))
                         + (f'; did you mean {close[0]}?' if close else ''))
    return runtime


def is_dense(model: nn.Module) -> bool:
    """A dense model: its network is ``forward_raw`` and its prediction ``head.predict`` (every detector)."""
    return hasattr(model, 'forward_raw') and hasattr(getattr(model, 'head', None), 'predict')


def _compiled(fn, options: dict | None):
    """``torch.compile(fn)`` with inductor's freezing, behind a code object of its own; every call runs under
    no_grad and outside inference_mode, so one graph serves callers in any grad mode (below).

    Freezing (weights folded in as constants, convolutions pre-packed for oneDNN) is decided from the global
    inductor config when a graph is compiled: passed in ``torch.compile(options=...)`` it is silently ignored
    (torch 2.14: the weights stay graph inputs and every convolution runs unpacked), so every call runs under
    ``config.patch(freezing=True)``, which covers the first compilation and any later one. The same patch adds
    zoo's pass that runs the frozen float32 linears in oneDNN instead of MKL (``_inductor_options``).

    Dynamo keeps compiled graphs, and counts recompilations against its limit (8), per code object; past the
    limit the code runs eagerly. Models that share one forward (every ``ClassifierBase`` family, every dense
    model's ``forward_raw``) would share one limit, and the ninth family optimised in a process would silently
    run eager. A fresh copy of the calling function's code gives each ``optimize`` its own cache and limit.

    Static shapes (``dynamic=False``): one graph per input shape, up to that limit of 8 per model. Dynamo's
    automatic dynamic shapes would compile a second batch size as a batch-symbolic graph, in which freezing
    cannot pre-pack convolution weights (slower), and whose layout planning is wrong for a 1-channel input
    (torch 2.14: a MetaFormer on 1-channel images fails with "expected size 16==16, stride 1==64" at its
    second batch size; pytorch/pytorch#121400 fixed that case once). Dynamo also remembers a function's
    dynamic dims by file and line across code objects, so a second model at another batch size was affected."""
    from zoo.layers._torch_compat import inductor_config

    config = inductor_config()

    def call(x):
        return fn(x)
    call.__code__ = call.__code__.replace()  # an equal but distinct code object
    # Freezing already makes each graph a snapshot of the model, so dynamo need not check the model's modules and
    # parameters at every call (75 us for raftmlp_tiny, 0.25-0.55 ms for RaftMLP-S at batch 1): only the input's
    # guards stay.
    options = {**(options or {}), 'guard_filter_fn': torch.compiler.skip_guard_on_all_nn_modules_unsafe}
    compiled = torch.compile(call, dynamic=False, options=options)

    def frozen(x):
        # One graph whatever mode the caller is in. Dynamo guards on the input's dispatch keys as the grad mode
        # leaves them: a plain or no_grad call sees autograd keys, a call under inference_mode does not, and a
        # tensor made under inference_mode has none, so each of the three compiled a graph of its own (a user's
        # ``with torch.inference_mode(): y = fast(x)`` compiled again). Every call runs outside inference_mode
        # under no_grad, with an inference tensor copied to a normal one (the input only).
        with torch.inference_mode(False), torch.no_grad(), config.patch(_inductor_options(config)):
            if isinstance(x, torch.Tensor) and x.is_inference():
                x = x.clone()
            return compiled(x)
    return frozen


def _inductor_options(config) -> dict:
    """Freezing, and zoo's oneDNN pass for frozen float32 linears (``zoo.layers.onednn.compiled_linear_pass``,
    off with ``ZOO_ONEDNN=0``) after any post-grad pass the user has set."""
    from zoo.layers.onednn import compiled_linear_pass

    ours, theirs = compiled_linear_pass(), config.post_grad_custom_pre_pass
    if ours is None:
        return {'freezing': True}
    passes = ours if theirs is None else [*(theirs if isinstance(theirs, (list, tuple)) else [theirs]), ours]
    return {'freezing': True, 'post_grad_custom_pre_pass': passes}


class _Raw(nn.Module):
    """A dense model's network alone: ``forward_raw`` as a tuple of maps (what the exporters capture).
    ``forward_raw``: the model's own method, or that method compiled."""

    def __init__(self, model: nn.Module, forward_raw=None):
        super().__init__()
        self.model, self._forward_raw = model, forward_raw or model.forward_raw

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self._forward_raw(x))


class _Deploy(nn.Module):
    """A detector with its prediction in the graph: (B, 3, H, W) -> (B, max_det, 6) rows of (x1, y1, x2, y2, score,
    label) in input pixels, best first; empty rows are zeros with label -1. The NMS is the head's own deployable
    prediction (``head.detections``, :func:`zoo.layers.detect.nms_rows`), the function ``head.predict`` calls
    eagerly: this module only joins it to the network."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.head.detections(self.model.forward_raw(x))


@contextlib.contextmanager
def _frozen(model: nn.Module):
    """Eval mode and no parameter needing a gradient while capturing (inference graphs), restored after.

    Grad mode stays on: with nothing requiring a gradient the graph is the inference graph, and a family's
    eager-only inference shortcut (taken under ``no_grad``) stays out of the captured graph."""
    was_training = model.training
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)
        model.train(was_training)


def is_detector(model: nn.Module) -> bool:
    """A dense model whose head has a deployable prediction, ``detections`` (what :class:`_Deploy` needs)."""
    return is_dense(model) and hasattr(model.head, 'detections')


def _graph_module(model: nn.Module, nms: bool = False) -> nn.Module:
    if nms:
        if not is_detector(model):
            raise ValueError(f'nms=True needs a detector (a dense model whose head has detections(), its decode and '
                             f'NMS); got {getattr(model, "zoo_name", type(model).__name__)}')
        return _Deploy(model)
    return _Raw(model) if is_dense(model) else model


def output_names(model: nn.Module, nms: bool = False) -> list[str]:
    """The names of the graph's outputs as ``export`` writes them (and ``zoo export``'s card lists them):
    ``detections`` with ``nms``, a detector's raw maps ``stride8``, ``stride16``, ... (one per level), ``logits``
    for classifiers, segmenters and language models, ``denoised`` for a denoiser (the task's ``output``)."""
    if nms:
        return ['detections']
    if is_detector(model):
        return [f'stride{s}' for s in model.strides]
    return [tasks.get(tasks.task_of(model)).output]


def _batch2(example: torch.Tensor) -> torch.Tensor:
    """Trace with a batch of at least 2: torch.export specialises a dimension of size 1."""
    if not isinstance(example, torch.Tensor) or example.ndim < 1:
        raise ValueError(f'example must be an input tensor with a batch dimension, got {type(example).__name__}')
    return example if example.shape[0] >= 2 else example.expand(2, *example.shape[1:]).contiguous()


def size_stride(model: nn.Module) -> int:
    """The multiple a model's input height and width must be for its feature maps to tile the image exactly: its
    largest feature stride (a detector's or segmenter's ``strides``, a classifier's ``feature_info`` reductions), 1
    for a network that keeps the resolution (DnCNN)."""
    strides = list(getattr(model, 'strides', None) or ())
    for owner in (model, getattr(model, 'backbone', None)):
        strides += [f['reduction'] for f in (getattr(owner, 'feature_info', None) or ())]
    return max(strides, default=1)


def check_dynamic_size(model: nn.Module) -> None:
    """A one-line error when ``model`` cannot be exported with a dynamic height and width: its weights are built
    for one grid (timm's ``pretrained_cfg['fixed_input_size']``: TNT's and PIIP's position embeddings, Strip-MLP's
    strip mixers)."""
    cfg = dict(getattr(model, 'pretrained_cfg', None) or {})
    if cfg.get('fixed_input_size'):
        size = tuple(cfg.get('input_size') or ())[-2:]
        name = getattr(model, 'zoo_name', type(model).__name__)
        raise ValueError(f'{name} has a fixed input size ({"x".join(map(str, size))}: pretrained_cfg '
                         'fixed_input_size, its weights are built for one grid), so its height and width cannot be '
                         'dynamic; export it without --dynamic-size, at the size it was built for')


def _dynamic(dynamic_batch: bool, stride: int | None = None):
    """``torch.export`` dynamic shapes of the input: the batch (``dynamic_batch``), and with ``stride`` the height and
    width as multiples of it (``stride * Dim``: derived dimensions, so the exporter knows every stage's map tiles
    exactly and emits no shape guard it cannot prove)."""
    dims = {0: torch.export.Dim('batch', min=1, max=4096)} if dynamic_batch else {}
    if stride is not None:
        dims[2] = stride * torch.export.Dim('height_blocks', min=1, max=8192 // stride)
        dims[3] = stride * torch.export.Dim('width_blocks', min=1, max=8192 // stride)
    return (dims,) if dims else None


def _size_example(example: torch.Tensor, stride: int) -> torch.Tensor:
    """The traced input of a dynamic-size export: its height and width must be multiples of ``stride``, and at least
    2 strides (torch.export specialises a dimension of size 1, which would fix that size in the graph); a smaller
    example is tiled (its values do not matter to the trace)."""
    h, w = example.shape[-2:]
    if h % stride or w % stride:
        raise ValueError(f'a dynamic-size export traces an input whose height and width are multiples of the model\'s '
                         f'stride {stride}; got {h}x{w} (give --img-size {max(2, -(-h // stride)) * stride})')
    reps = max(1, -(-2 * stride // min(h, w)))
    return example.repeat(1, 1, reps, reps) if reps > 1 else example


def export(model: nn.Module, path, example: torch.Tensor, *, format: str = 'onnx', dynamic_batch: bool = True,
           nms: bool = False, dynamic_size: bool = False) -> pathlib.Path:
    """Save ``model`` (eval mode) as an ONNX file (``torch.onnx.export(..., dynamo=True)``) or a ``torch.export``
    program (``format='pt2'``, ``torch.export.save``), traced on ``example`` with a dynamic batch.

    A dense model is saved as its network (``forward_raw``: one output per level); ``nms=True`` saves a detector
    with its head's decode and NMS in the graph instead (``head.detections``: one (B, max_det, 6) output).
    ``model`` may also be a ``torch.export.ExportedProgram`` (e.g. a loaded pt2 file), converted to ONNX without
    tracing again.
    The ONNX graph's input is ``input``, its outputs are named by :func:`output_names` (a program's keep the
    exporter's names) and its dynamic dimension is ``batch``. Returns the path.

    ``dynamic_size``: the height and width are dynamic too, as multiples of the model's stride (:func:`size_stride`;
    ``stride * Dim('height_blocks')`` in torch.export's dynamic shapes), so one file serves every resolution the
    architecture takes: convolutional and pooling families (ResNet, VGG, PoolFormer/MetaFormer with pooling,
    DnCNN). A model whose weights are built for one grid (``fixed_input_size``: TNT, PIIP, Strip-MLP) is refused
    in one line (:func:`check_dynamic_size`); one whose forward fixes the size in another way fails in the exporter.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; expected one of {', '.join(FORMATS)}")
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(model, torch.export.ExportedProgram):
        if format == 'pt2':
            torch.export.save(model, path)
        else:
            _onnx_program(model, example, dynamic_batch).save(str(path))
        return path
    names = output_names(model, nms)
    example = _batch2(example) if dynamic_batch else example
    stride = None
    if dynamic_size:
        check_dynamic_size(model)
        stride = size_stride(model)
        example = _size_example(example, stride)
    with _frozen(model):
        net = _graph_module(model, nms)
        if format == 'pt2':
            ep = torch.export.export(net, (example,), dynamic_shapes=_dynamic(dynamic_batch, stride))
            torch.export.save(ep, path)
        else:
            _onnx_program(net, example, dynamic_batch, names, stride).save(str(path))
            if stride is not None and not _missing('onnxruntime'):
                _check_sizes(net, path, example, stride)
    return path


def _check_sizes(net: nn.Module, path: pathlib.Path, example: torch.Tensor, stride: int) -> None:
    """A dynamic-size ONNX file must run in ONNX Runtime at the traced size and at another one (one stride more in
    height, two in width) and give the eager network's output there: an exporter can write a graph that only the
    traced size runs (RaftMLP's bicubic resize of its token grid becomes a Resize that ONNX Runtime refuses at other
    scales). Otherwise the file is removed and a one-line error says why."""
    from zoo.layers._torch_compat import tree_flatten

    import onnxruntime as ort

    name = getattr(net, 'zoo_name', getattr(getattr(net, 'model', None), 'zoo_name', type(net).__name__))
    opts = ort_session_options()
    opts.log_severity_level = 4      # a refusal is reported below in one line, not also by ONNX Runtime's logger
    sess = ort.InferenceSession(str(path), opts, providers=['CPUExecutionProvider'])

    def run(x):
        return [torch.from_numpy(o) for o in sess.run(None, {sess.get_inputs()[0].name: x.numpy()})]
    h, w = example.shape[-2:]
    for size in ((h, w), (h + stride, w + 2 * stride)):
        x = torch.randn(1, *example.shape[1:-2], *size, generator=torch.Generator().manual_seed(0))
        try:
            got = run(x)
            with torch.no_grad():
                want = tree_flatten(net(x))[0]
            ok = len(got) == len(want) and all(g.shape == e.shape and torch.allclose(g, e.float(), rtol=1e-3, atol=1e-4)
                                               for g, e in zip(got, want))
            why = None if ok else 'its output differs from eager'
        except Exception as e:  # ONNX Runtime's refusal of the graph at this size
            why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        if why:
            path.unlink(missing_ok=True)
            raise ValueError(f'{name}: the dynamic-size ONNX graph does not run at {size[0]}x{size[1]} in ONNX Runtime '
                             f'({why}); export it without --dynamic-size')


def _onnx_program(net: nn.Module, example: torch.Tensor, dynamic_batch: bool = True,
                  names: list[str] | None = None, stride: int | None = None):
    """``torch.onnx.export(dynamo=True)``, then constant folding, common subexpressions and dead nodes removed.

    Not the exporter's ``optimize=True``: its pattern rewriter took 2/3 of a Mamba-YOLO export (~70 s of ~100 s
    CPU for the tiny variant, growing faster than the graph) for fusions ONNX Runtime and OpenVINO make
    themselves when they load the graph; folding alone takes ~1.5 s and leaves ~15% more nodes."""
    _require('onnx')
    import io
    import warnings

    from onnx_ir.passes import common
    from onnxscript.optimizer import fold_constants_ir

    from zoo.layers.selective_scan_graph import decompose
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter('ignore')
        # zoo's operators (the selective scan) have no ONNX meaning: exported written out as plain tensor ops
        # the dynamic shapes again: given a program without them, the exporter names the batch after its symbol (s77)
        shapes = _dynamic(dynamic_batch, stride)      # stride: dynamic height and width too
        program = torch.onnx.export(decompose(net, (example,), shapes), (example,), dynamo=True,
                                    input_names=['input'], output_names=names, dynamic_shapes=shapes,
                                    verbose=False, report=False, optimize=False)
    model = program.model
    common.InlinePass()(model)
    fold_constants_ir(model)
    for p in (common.RemoveUnusedNodesPass(), common.LiftConstantsToInitializersPass(lift_all_constants=True,
                                                                                          size_limit=0),
              common.DeduplicateInitializersPass(), common.CommonSubexpressionEliminationPass(),
              common.RemoveUnusedNodesPass()):
        p(model)
    return program


class _Runtime(nn.Module):
    """A captured network: ``forward(x)`` gives what the eager module gives (same nesting of tensors)."""

    def __init__(self, fn, spec, name: str, keep: nn.Module | None = None):
        super().__init__()
        self._fn, self._spec, self.runtime = fn, spec, name
        self._keep = [keep]  # the eager module stays alive (its weights) but is not a submodule

    @property
    def session(self):
        """The ``onnxruntime.InferenceSession`` that runs the graph (None in another runtime)."""
        return getattr(self._fn, 'session', None)

    def forward(self, x: torch.Tensor):
        from zoo.layers._torch_compat import tree_unflatten
        return tree_unflatten(list(self._fn(x)), self._spec)


class _DenseRuntime(nn.Module):
    """A dense model whose network (``forward_raw``) runs in a runtime. Everything after the network is the eager
    model's own code called with this network in its place: ``forward`` is ``model.predict`` (a detector's decode
    and NMS, a segmenter's logits and argmax), ``logits`` a segmenter's whole-image or sliding-window inference,
    ``head`` its loss. A system therefore evaluates a runtime through the same lines as the eager model."""

    def __init__(self, net: nn.Module, model: nn.Module):
        super().__init__()
        self.net, self.head = net, model.head
        self.strides, self.num_classes = model.strides, model.num_classes
        self.zoo_name = getattr(model, 'zoo_name', type(model).__name__)
        self.runtime = getattr(net, 'runtime', None)
        self._model = [model]  # its inference code; in a list, so its weights are not registered here a second time

    def forward_raw(self, x: torch.Tensor) -> list[torch.Tensor]:
        return list(self.net(x))

    def _float_raw(self, x: torch.Tensor) -> list[torch.Tensor]:
        # the head's float32 weights decode the maps: a network run in bfloat16 (autocast) hands over float32
        return [m.float() for m in self.net(x)]

    @property
    def test_mode(self) -> str:
        """A segmenter's evaluation: ``'whole'`` or ``'slide'`` (the eager model's setting)."""
        return self._model[0].test_mode

    def logits(self, x: torch.Tensor, test_mode: str | None = None) -> torch.Tensor:
        """A segmenter's class logits at the input's size (:meth:`zoo.segmentation.Segmenter.logits`)."""
        return self._model[0].logits(x, test_mode, forward_raw=self._float_raw)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, metas=None):
        return self._model[0].predict(x, metas, forward_raw=self._float_raw)


class _Eager(nn.Module):
    """The eager module in eval mode, under no_grad (and autocast when a dtype is asked for)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype | None = None, runtime: str = 'eager'):
        super().__init__()
        self.model, self.dtype, self.runtime = model, dtype, runtime

    def forward(self, x: torch.Tensor):
        with torch.no_grad(), (torch.autocast(x.device.type, dtype=self.dtype) if self.dtype not in (None, torch.float32)
                               else contextlib.nullcontext()):
            return self.model(x)


# ONNX Runtime's thread pools spin between calls by default, holding the cores after a session returns: in one
# process every runtime timed after an ORT session ran on cores ORT was still spinning on (a ResNet-tiny ORT cell
# published at 17-21 ms took 2.3 ms timed alone; issue 43). Off, the workers sleep as torch's do between calls.
ORT_NO_SPINNING = {'session.intra_op.allow_spinning': '0', 'session.inter_op.allow_spinning': '0'}


def ort_session_options(threads: int | None = None):
    """``onnxruntime.SessionOptions`` of every zoo session: ``threads`` intra-op threads (default torch's: a fair
    comparison), one inter-op thread, all graph optimisations, and no thread pool spinning (``ORT_NO_SPINNING``).
    Public so scripts that build their own sessions (``benchmarks/scan_onnx.py``) time under the same settings."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or torch.get_num_threads()
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    for key, value in ORT_NO_SPINNING.items():
        opts.add_session_config_entry(key, value)
    return opts


def _ort_session(path: str):
    import onnxruntime as ort
    sess = ort.InferenceSession(path, ort_session_options(), providers=['CPUExecutionProvider'])
    name = sess.get_inputs()[0].name

    def run(x: torch.Tensor):
        return [torch.from_numpy(o) for o in sess.run(None, {name: x.detach().cpu().numpy()})]
    run.session = sess           # its settings can be read back (``_Runtime.session``)
    return run


def _openvino(path):
    """An OpenVINO CPU inference call of an ONNX file (or an ``openvino.Model``, e.g. NNCF's int8 one)."""
    import openvino as ov
    core = ov.Core()
    compiled = core.compile_model(core.read_model(path) if isinstance(path, str) else path, 'CPU',
                                  {'INFERENCE_NUM_THREADS': torch.get_num_threads(),
                                   'INFERENCE_PRECISION_HINT': 'f32'})

    def run(x: torch.Tensor):
        res = compiled(x.detach().cpu().numpy())
        return [torch.from_numpy(res[o].copy()) for o in compiled.outputs]
    return run


def optimize(model: nn.Module, runtime: str = 'compile', example: torch.Tensor | None = None, *,
             dtype: torch.dtype | str | None = None, mode: str | None = None, calibration=None,
             int8_only: Callable[[str], bool] | None = None) -> nn.Module:
    """``model`` (put in eval mode) in a runtime: a module whose output equals ``model(x)`` in eval mode.

    runtime: ``'eager'`` (the module itself, under no_grad), ``'compile'`` (``torch.compile`` with inductor's
    freezing; ``mode`` is torch.compile's mode; each graph is a snapshot of the model as it was
    compiled: after changing the model, optimize it again), ``'onnxruntime'`` or ``'openvino'`` (exported to ONNX
    with a dynamic batch, traced on ``example`` (default: a random input of the model's registered size), and run
    in an inference session), ``'onnxruntime-int8'`` or ``'openvino-int8'`` (that graph quantized to int8 after
    training, its ranges set on ``calibration``: a few batches of real inputs; ``zoo._quantize``; ``int8_only``, a
    test on a weighted op's module path such as ``'stages.0.blocks.1.token_mixer.fc1'``, quantizes only the ops it
    accepts, for one block kind at a time). ``dtype`` (e.g.
    ``torch.bfloat16``) runs eager/compile under autocast; the ONNX runtimes take float32 inputs. ``'auto'``: the
    fastest float32 runtime whose outputs equal eager's, measured on ``example`` on this CPU and cached
    (``zoo._auto``); the returned module's ``runtime`` says which. A dense model keeps its eager prediction (decode, NMS) after the captured network
    (see the module docstring). With ``example``, ``compile`` compiles on it before returning.
    """
    from ._quantize import INT8_RUNTIMES, check_calibration
    check_runtime(runtime)
    if runtime == 'auto':
        if dtype is not None or mode is not None or calibration is not None or int8_only is not None:
            raise ValueError("runtime 'auto' chooses among the float32 runtimes at their defaults; it takes no "
                             'dtype, mode, calibration or int8_only (name the runtime instead)')
        from ._auto import CANDIDATES, choose
        example = example if example is not None else example_input(model)
        usable = [rt for rt in CANDIDATES if not _missing(rt)]
        return choose(model, example, lambda rt: optimize(model, rt, example), candidates=usable)
    if runtime not in ('eager', 'compile'):
        _require(runtime)
    if runtime in INT8_RUNTIMES:
        check_calibration(runtime, calibration)
    elif calibration is not None or int8_only is not None:
        raise ValueError(f'calibration and int8_only are for the int8 runtimes ({", ".join(INT8_RUNTIMES)}); '
                         f'runtime {runtime!r} takes neither')
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None) if isinstance(getattr(torch, dtype, None), torch.dtype) else \
            _bad_dtype(dtype)
    if mode is not None and runtime != 'compile':
        raise ValueError(f"mode={mode!r} is torch.compile's; runtime {runtime!r} takes none")
    from ._console import progress
    model.eval()
    name = getattr(model, 'zoo_name', type(model).__name__)
    dense = is_dense(model)
    if dense and example is not None and hasattr(model, 'network_input'):
        example = model.network_input(example)  # a segmenter's network sees a padded (sliding) window, not x
    if runtime in ('eager', 'compile'):
        inner = _Raw(model) if dense else model
        if runtime == 'compile':
            from zoo.layers._torch_compat import inductor_mode_options
            options = inductor_mode_options(mode) if mode else None
            inner = _Raw(model, _compiled(model.forward_raw, options)) if dense else _compiled(model, options)
        net = _Eager(inner, dtype, runtime)
        if runtime == 'compile' and example is not None:
            with progress(f'compiling {name} (torch.compile, inductor with freezing)'):
                net(example)  # compile now, not on the caller's first timed call
        if not dense:
            return net
        return _DenseRuntime(net, model)  # net gives _Raw's tuple of maps (one per level, or one for a segmenter)
    if dtype not in (None, torch.float32):
        raise ValueError(f'runtime {runtime!r} runs float32 only; got dtype={dtype}')
    example = _batch2(example if example is not None else example_input(model, batch_size=2))
    from zoo.layers._torch_compat import tree_flatten
    with progress(f'exporting {name} to ONNX for {runtime}'):
        with _frozen(model):
            graph = _graph_module(model)
            _, spec = tree_flatten(graph(example))
            program = _onnx_program(graph, example, names=output_names(model))
        with tempfile.TemporaryDirectory() as tmp:
            path = str(pathlib.Path(tmp) / 'model.onnx')
            program.save(path)
            if runtime in INT8_RUNTIMES:
                from ._quantize import batch_inputs, float_modules, openvino_int8, quantize_onnx
                if dense and hasattr(model, 'network_input'):
                    calibration = [model.network_input(batch_inputs(b)) for b in calibration]
                only = None
                if int8_only is not None:
                    prefix = '' if graph is model else 'model.'  # a path in the exported wrapper -> in the model
                    only = lambda path: path.startswith(prefix) and int8_only(path[len(prefix):])  # noqa: E731
                with progress(f'quantizing {name} to int8 for {runtime.removesuffix("-int8")}'):
                    keep = float_modules(model, graph)
                    if runtime == 'onnxruntime-int8':
                        run = _ort_session(str(quantize_onnx(path, pathlib.Path(tmp) / 'int8.onnx', calibration,
                                                             keep_float=keep, only=only)))
                    else:
                        run = _openvino(openvino_int8(path, calibration, keep_float=keep, only=only))
            else:
                run = _ort_session(path) if runtime == 'onnxruntime' else _openvino(path)
    net = _Runtime(run, spec, runtime, keep=model)
    return _DenseRuntime(net, model) if dense else net


def _bad_dtype(name: str):
    raise ValueError(f'unknown dtype {name!r}; expected a torch dtype such as float32 or bfloat16')
