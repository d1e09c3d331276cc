"""INT8 runtimes: static post-training quantization of a zoo model's exported ONNX graph.

>>> calib = [x for x, _ in itertools.islice(datamodule.train_dataloader(), 8)]   # real inputs
>>> int8 = zoo.optimize(model, 'onnxruntime-int8', example=calib[0], calibration=calib)

Two paths, the ones users of each runtime take:

- ``onnxruntime-int8``: ONNX Runtime's ``quantize_static`` (QDQ format, per-channel int8 weights, uint8 activations:
  U8S8, the pair x86's VNNI instruction multiplies; S8S8 ran timm's ResNet-50 at batch 16 2.15x slower on the AMD
  EPYC, 526 vs 245 ms; ORT's saturation caveat is for AVX2/AVX-512 without VNNI), on the graph
  ``quant_pre_process`` has folded (BatchNorm into the
  convolution before its weights are quantized, or the int8 weights are those of a layer ORT then cannot fuse);
  only ``Conv``, ``Gemm`` and ``MatMul`` are quantized, the weighted ops (ultralytics' "Quantize only weighted ops for
  ONNX INT8"), so norms, GELU, softmax and pooling stay float.
- ``openvino-int8``: NNCF's post-training quantization (``nncf.quantize``, its default mixed preset) of the graph
  read by OpenVINO, compiled for the CPU.

Both keep :func:`float_modules` in float: the classifier (``pretrained_cfg['classifier']``) or a dense model's
head, whose outputs are the scores, and the first convolution (``pretrained_cfg['first_conv']``), which sees the raw
image on three channels and costs little. A node belongs to a module by the module path the ONNX exporter writes
in each node's metadata (``pkg.torch.onnx.name_scopes``).

Calibration sets the activation ranges, so it must be real data: ``zoo test --runtime onnxruntime-int8`` draws it
from the recipe's training split; ``zoo bench`` (timing only) calibrates on random inputs.
"""
from __future__ import annotations

import pathlib
from typing import Callable, Iterable

import torch
from torch import nn

__all__ = ['CALIBRATION_IMAGES', 'INT8_RUNTIMES', 'batch_inputs', 'float_modules', 'int8_fraction', 'openvino_int8',
           'quantize_onnx', 'training_calibration']

INT8_RUNTIMES = ('onnxruntime-int8', 'openvino-int8')
QUANTIZED_OPS = ('Conv', 'Gemm', 'MatMul')
_SCOPES = 'pkg.torch.onnx.name_scopes'


def float_modules(model: nn.Module, graph: nn.Module | None = None) -> tuple[str, ...]:
    """Module paths kept in float: the classifier (or a dense model's ``head``) and the first convolution, as
    paths in ``graph``, the module exported (a dense model's network or deployable wrapper holds the model as
    ``.model``; default: the model itself)."""
    cfg = getattr(model, 'pretrained_cfg', None) or {}
    keep = []
    if hasattr(model, 'forward_raw') and hasattr(model, 'head'):
        keep.append('head')
    classifier = cfg.get('classifier')
    keep += [classifier] if isinstance(classifier, str) else list(classifier or ())
    first = cfg.get('first_conv')
    keep += [first] if isinstance(first, str) else list(first or ())
    prefix = '' if graph is None or graph is model else 'model.'
    return tuple(dict.fromkeys(prefix + k for k in keep if k))


# the training images that set the activation ranges (``zoo test --runtime *-int8``, ``zoo export --int8``)
CALIBRATION_IMAGES = 256


def batch_inputs(batch):
    """A batch's inputs: the first item of an ``(inputs, targets)`` batch as a DataLoader gives it, else itself."""
    return batch[0] if isinstance(batch, (tuple, list)) else batch


def training_calibration(datamodule, images: int = CALIBRATION_IMAGES) -> list[torch.Tensor]:
    """The inputs of the first ``images`` images of ``datamodule``'s training loader: an int8 runtime's
    calibration set, never the split that is evaluated."""
    datamodule.setup('fit')
    out, seen = [], 0
    for batch in datamodule.train_dataloader():
        x = batch_inputs(batch)
        out.append(x)
        seen += len(x)
        if seen >= images:
            break
    if not out:
        raise ValueError('the calibration data gave no batch (an empty training split?)')
    return out


def _module_path(node) -> str:
    """The module a node was exported from ('' at the top), read from the exporter's name-scope metadata."""
    import ast
    meta = {p.key: p.value for p in node.metadata_props}
    scopes = meta.get(_SCOPES)
    if not scopes:
        return ''
    scopes = ast.literal_eval(scopes)  # ['', 'layers.0', 'layers.0.0', ..., 'conv2d_1']: the last is the op
    return scopes[-2] if len(scopes) >= 2 else ''


def weighted_nodes(graph_path: str | pathlib.Path) -> list[tuple[str, str]]:
    """``(node name, module path)`` of the graph's quantizable nodes (:data:`QUANTIZED_OPS`)."""
    import onnx
    return [(node.name, _module_path(node)) for node in onnx.load(str(graph_path), load_external_data=False).graph.node
            if node.op_type in QUANTIZED_OPS]


def _under(path: str, modules: tuple[str, ...]) -> bool:
    return any(path == m or path.startswith(m + '.') for m in modules)


def float_nodes(graph_path: str | pathlib.Path, keep_float: Iterable[str] = (),
                only: Callable[[str], bool] | None = None) -> list[str]:
    """Names of the graph's quantizable nodes left float: those of the ``keep_float`` modules (or below) and, with
    ``only`` (a test on a node's module path), those it rejects."""
    keep_float = tuple(keep_float)
    return [name for name, path in weighted_nodes(graph_path)
            if _under(path, keep_float) or (only is not None and not only(path))]


def _batches(calibration):
    """Calibration inputs as a list of float32 NumPy batches (a tensor, or an iterable of tensors or
    ``(inputs, targets)`` pairs as a DataLoader gives them)."""
    if isinstance(calibration, torch.Tensor):
        calibration = [calibration]
    out = []
    for b in calibration:
        x = batch_inputs(b)
        if not isinstance(x, torch.Tensor):
            raise ValueError('calibration must be input tensors (or (input, target) batches); got '
                             f'{type(x).__name__}')
        out.append(x.detach().cpu().numpy())  # float images, or a language model's int64 tokens
    if not out:
        raise ValueError('calibration is empty: give a few batches of real inputs (e.g. 8 batches of the '
                         'training data)')
    return out


def quantize_onnx(src: str | pathlib.Path, dst: str | pathlib.Path, calibration, *,
                  keep_float: Iterable[str] = (), only: Callable[[str], bool] | None = None) -> pathlib.Path:
    """``src`` (a float ONNX graph with input ``input``) quantized for ONNX Runtime into ``dst``: QDQ, per-channel
    int8 weights, uint8 activations calibrated by min-max on ``calibration``; Conv / Gemm / MatMul only, the nodes
    of the ``keep_float`` modules left float, and with ``only`` those whose module path it rejects (one block kind
    at a time: ``zoo.eval.breakdown.int8_sensitivity``). Returns ``dst``."""
    import contextlib
    import io
    import logging

    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quant_pre_process,
                                          quantize_static)

    batches = _batches(calibration)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._it = iter(batches)

        def get_next(self):
            x = next(self._it, None)
            return None if x is None else {'input': x}

    dst = pathlib.Path(dst)
    folded = dst.with_suffix('.prep.onnx')
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # ORT's quantizer logs its advice on the root logger
    exclude = float_nodes(src, keep_float, only)  # before folding: ORT's optimizer keeps node names, not their metadata
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            quant_pre_process(str(src), str(folded), skip_symbolic_shape=True)
        _unshare_initializers(folded)
        quantize_static(str(folded), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=list(QUANTIZED_OPS), nodes_to_exclude=exclude)
    finally:
        root.setLevel(level)
        folded.unlink(missing_ok=True)
    return dst


def _unshare_initializers(path: pathlib.Path) -> None:
    """Give every quantized node's weight and bias an initializer of its own, in place. The export deduplicates
    equal initializers (a zero bias shared by two convolutions), and ORT's quantizer, which quantizes a bias with
    each user's scales, then wrote two definitions of one name (an invalid graph: Strip-MLP's trained
    checkpoints)."""
    import onnx

    model = onnx.load(str(path))
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    users: dict[str, int] = {}
    for node in g.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    for node in g.node:
        if node.op_type not in QUANTIZED_OPS:
            continue
        for k, name in enumerate(node.input):
            if k == 0 or name not in inits or users[name] < 2:
                continue
            copy = onnx.TensorProto()
            copy.CopyFrom(inits[name])
            copy.name = f'{name}__{node.name}'
            g.initializer.append(copy)
            node.input[k] = copy.name
            users[name] -= 1
    onnx.save(model, str(path))


def openvino_int8(src: str | pathlib.Path, calibration, *, keep_float: Iterable[str] = (),
                  only: Callable[[str], bool] | None = None):
    """``src`` read by OpenVINO and quantized by NNCF (``nncf.quantize``, min-max ranges on every calibration
    batch), the nodes of the ``keep_float`` modules ignored; returns the ``openvino.Model``."""
    import logging

    import nncf
    import openvino as ov

    batches = _batches(calibration)
    names = float_nodes(src, keep_float, only)
    # OpenVINO names an op after its ONNX node, plus a suffix for the parts it splits a node into
    ignored = nncf.IgnoredScope(patterns=[f'^{n}(/.*)?$' for n in names], validate=False) if names else None
    nncf_log = logging.getLogger('nncf')
    level = nncf_log.level
    nncf_log.setLevel(logging.ERROR)
    try:
        model = ov.Core().read_model(str(src))
        return nncf.quantize(model, nncf.Dataset(batches), subset_size=sum(len(b) for b in batches),
                             ignored_scope=ignored)
    finally:
        nncf_log.setLevel(level)


def int8_fraction(graph_path: str | pathlib.Path) -> tuple[int, int]:
    """(quantized, all) weighted nodes of an ONNX Runtime QDQ graph: a node counts as quantized when its weight
    input comes from a ``DequantizeLinear``."""
    import onnx
    g = onnx.load(str(graph_path), load_external_data=False).graph
    dq = {o for n in g.node if n.op_type == 'DequantizeLinear' for o in n.output}
    weighted = [n for n in g.node if n.op_type in QUANTIZED_OPS]
    return sum(len(n.input) > 1 and n.input[1] in dq for n in weighted), len(weighted)


def check_calibration(runtime: str, calibration) -> None:
    """A one-line error when an int8 runtime is asked for without calibration inputs."""
    if calibration is None:
        raise ValueError(f'{runtime} needs calibration=: a few batches of real inputs (e.g. 8 batches of the '
                         f'training data), which set the int8 ranges; `zoo test --runtime {runtime}` draws them '
                         f'from the recipe\'s training split')

