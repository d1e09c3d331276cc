"""``zoo export -c CONFIG|NAME [--ckpt_path best|last|PATH] [--weights auto|ema|model] [--random-init [--seed S]]
--format onnx|pt2 [--nms] [--int8]``.

Writes the network as an ONNX file (``torch.onnx.export(..., dynamo=True)``, dynamic batch) or a ``torch.export``
program (``.pt2``) through ``zoo.export``, and a JSON card beside it (``<file>.json``): what a deployment needs to
feed the graph and read its output (input size, mean/std, class names, the output layout) and where it came from
(the zoo version, the model's creation arguments, the recipe and checkpoint, the run's own resolved config,
format and opset), and the preprocessing the run's data applied (a detector's letterbox, which maps its boxes back
to the file's pixels; a segmenter's resize; a classifier's resize, crop and mean/std).

The checkpoint of a recipe is found as ``zoo test``/``zoo predict`` find it (``runs.resolve_checkpoint``,
``checkpointing.read_checkpoint``/``check_checkpoint_model``/``check_weights_fit``); a ``zoo fit`` checkpoint
carries the model's name, arguments and the sizes the data gave it, so the network is rebuilt from it and gets
the weights evaluation used (the EMA's when the run kept one), read by ``zoo.read_weights`` as ``zoo.create(
checkpoint=)`` reads them; ``--weights ema|model`` asks for one copy, and the card's ``model.weights`` says which
was taken. A bare NAME has no trained weights: it is refused
unless ``--random-init`` asks for its initialisation, seeded by ``--seed`` so that ``torch.manual_seed(seed);
zoo.create(name)`` rebuilds it. Nothing is overwritten without ``--overwrite``.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

import zoo

from . import runs

SIZES = ('num_classes', 'in_chans', 'img_size', 'vocab_size')     # what a zoo fit run linked from its data


def _recipe(config: str) -> tuple[Path, dict]:
    import yaml

    path = runs.find_recipe(config)
    cfg = yaml.safe_load(path.read_text()) or {}
    if not isinstance(cfg.get('model'), dict):
        raise ValueError(f'-c {config}: {path} has no model section (a zoo fit recipe is expected)')
    return path, cfg


def _checkpoint(which: str | None, stem: str | None, run_root: str) -> Path | None:
    if which is None:
        return None
    if which in runs.KEYWORDS and not Path(which).is_file():
        if stem is None:
            raise ValueError(f'--ckpt_path {which} picks a run of a recipe: give -c CONFIG (or a checkpoint file)')
        return runs.resolve_checkpoint(run_root, stem, which)
    if not Path(which).is_file():
        raise FileNotFoundError(f'--ckpt_path {which}: no such file (or one of: {", ".join(runs.KEYWORDS)} with -c)')
    return Path(which)


def _from_lightning(path: Path, name: str | None, class_path: str | None,
                    weights: str = 'auto') -> tuple[nn.Module, dict]:
    """The network of a ``zoo fit`` checkpoint, rebuilt from its hyper-parameters, with the weights
    ``zoo.read_weights`` takes (``'auto'``: the evaluated ones, the EMA when the run kept one)."""
    from .checkpointing import check_checkpoint_model, check_weights_fit, read_checkpoint  # Lightning: only here

    ckpt = read_checkpoint(path)
    check_checkpoint_model(ckpt, path, name, class_path)
    hp = dict(ckpt.get('hyper_parameters') or {})
    name = hp.get('name') or name
    if not name:
        raise ValueError(f'--ckpt_path {path} does not name its model (not written by a zoo recipe?)')
    sizes = {k: hp.get(k) for k in SIZES}
    args = dict(hp.get('model_args') or {})
    net = zoo.create_with_optional(name, sizes, **args)
    check_weights_fit(ckpt, path, nn.ModuleDict({'model': net}))
    sd, chosen = zoo.read_weights(ckpt, weights, where=str(path))
    net.load_state_dict(sd)
    created = {'name': name, 'kwargs': {**{k: v for k, v in sizes.items() if v is not None}, **args},
               'weights': chosen, 'epoch': ckpt.get('epoch'), 'global_step': ckpt.get('global_step')}
    return net, created


def trained_run(ckpt: str | Path, weights: str = 'auto'):
    """A ``zoo fit`` checkpoint's network (``weights``: see ``zoo.read_weights``) in eval mode, how it was created
    and its run's DataModule (rebuilt from the run's ``config.yaml``; None when there is none): what a study
    needs to evaluate a trained network outside Lightning."""
    ckpt = Path(ckpt)
    if not ckpt.is_file():
        raise FileNotFoundError(f'{ckpt}: no such checkpoint file')
    net, created = _from_lightning(ckpt, None, None, weights)
    return net.eval(), created, _data_module(_run_config(ckpt)[1])


def _run_config(ckpt: Path | None) -> tuple[Path | None, dict | None]:
    """The resolved ``config.yaml`` of the run a checkpoint belongs to (``<run>/checkpoints/<file>.ckpt``), if any:
    what the run really trained with, overrides included."""
    import yaml

    if ckpt is None or ckpt.parent.name != 'checkpoints':
        return None, None
    path = ckpt.parent.parent / 'config.yaml'
    return (path, yaml.safe_load(path.read_text()) or {}) if path.is_file() else (None, None)


def _data_module(cfg: dict | None):
    """The config's DataModule, constructed as LightningCLI constructs it (no ``setup``: nothing is loaded or drawn),
    or None when the config has none or it cannot be built here (its files moved, say)."""
    data = (cfg or {}).get('data')
    if not isinstance(data, dict) or 'class_path' not in data:
        return None
    from jsonargparse import ArgumentParser
    from lightning.pytorch import LightningDataModule

    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(LightningDataModule, 'data', required=True)
    try:
        return parser.instantiate(parser.parse_object({'data': data})).data
    except Exception as e:  # the card is still written, without what only the data knows
        from zoo.eval.bench import error_summary

        print(f'zoo export: warning: {data["class_path"]} could not be built ({error_summary(e)}); the card has '
              'no class names or data preprocessing', file=sys.stderr)
        return None


def _class_names(dm) -> list[str] | None:
    names = next((getattr(dm, a) for a in ('names', 'class_names', 'classes') if getattr(dm, a, None)), None)
    return list(names) if isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names) else None


def _floats(value) -> list[float] | None:
    if value is None:
        return None
    return [float(v) for v in value] if isinstance(value, (tuple, list)) else [float(value)]


def _preprocessing(task: str, dm, size: tuple, pcfg: dict) -> dict | None:
    """How a file becomes the graph's input, as the run's evaluation did it: a deployment repeats these steps (and,
    for a detector, undoes the letterbox on the boxes). ``dm`` None (a bare NAME): the zoo pipeline of the task with
    the model's own mean/std."""
    if len(size) != 3:
        return None
    c, h, w = size
    mean = _floats(getattr(dm, 'mean', None) if dm is not None else pcfg.get('mean'))
    std = _floats(getattr(dm, 'std', None) if dm is not None else pcfg.get('std'))
    if task == 'detection':
        from zoo.datasets.detection.transforms import PAD_VALUE

        s = max(h, w)
        return {
            'kind': 'letterbox', 'size': [s, s], 'pad_value': PAD_VALUE, 'mean': None, 'std': None,
            'steps': [f'scale = {s} / max(H, W) of the file (H x W); resize to (h, w) = (round(H * scale), '
                      'round(W * scale)), bilinear with antialias, keeping the aspect ratio',
                      f'pad to {s} x {s} with {PAD_VALUE} (0-255), centred: left = ({s} - w) // 2, top = ({s} - h) '
                      '// 2, the rest right and bottom',
                      'RGB values / 255 (0..1); no mean/std'],
            'to_file_pixels': 'x_file = (x - left) / (w / W), y_file = (y - top) / (h / H), clipped to the file '
                              '(zoo.layers.detect.unletterbox with scale (w / W, h / H), pad (left, top))',
            'reference': 'zoo.datasets.detection.letterbox'}
    if task == 'segmentation':
        return {
            'kind': 'resize', 'size': [h, w], 'mean': mean, 'std': std,
            'steps': [f'resize the whole file to {h} x {w} (aspect ratio not kept), bilinear with antialias',
                      'RGB values / 255 (0..1)', 'subtract mean, divide by std, per channel'],
            'reference': 'zoo.datasets.segmentation.segmentation_transforms(None, img_size, mean, std)'}
    if task == 'classification':
        crop_pct = float(getattr(dm, 'crop_pct', None) or (1.0 if dm is not None else pcfg.get('crop_pct') or 1.0))
        interpolation = 'bilinear' if dm is not None else pcfg.get('interpolation') or 'bilinear'
        steps = ([f'resize the shorter side to {int(h / crop_pct)} (= int({h} / crop_pct {crop_pct})), '
                  f'{interpolation}', f'centre crop {h} x {w}'] if crop_pct != 1.0 else
                 [f'resize to {h} x {w}, {interpolation}'])
        steps += [f'{"grey" if c == 1 else "RGB"} values / 255 (0..1)', 'subtract mean, divide by std, per channel']
        return {'kind': 'resize_center_crop' if crop_pct != 1.0 else 'resize', 'size': [h, w], 'crop_pct': crop_pct,
                'interpolation': interpolation, 'mean': mean, 'std': std, 'steps': steps}
    return None


def _outputs(net: nn.Module, example: torch.Tensor, nms: bool, task: str, size: tuple) -> list[dict]:
    """The graph's outputs: the names ``zoo.export`` gives them, their shapes (batch first) and what they hold."""
    from zoo._runtime import _frozen, _graph_module, output_names

    with _frozen(net), torch.no_grad():
        outs = _graph_module(net, nms)(example)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    names = output_names(net, nms)
    rows = [{'name': n, 'shape': ['batch', *o.shape[1:]]} for n, o in zip(names, outs)]
    if nms:
        rows[0]['what'] = ('rows of (x1, y1, x2, y2, score, label), best first, in input pixels (preprocessing.'
                           'to_file_pixels maps them to the file); unused rows are zeros with label -1')
    elif task == 'detection':
        for row, s in zip(rows, net.strides):
            row['what'] = (f'stride-{s} map: 4 x {net.head.reg_max} box-side distributions (DFL) then '
                           f'{net.num_classes} class logits per cell; decode and NMS are not in the graph '
                           '(export with --nms for detections)')
    elif task == 'segmentation':
        oh, ow = outs[0].shape[-2:]
        rows[0]['what'] = (f'segmentation logits (batch, num_classes, H, W), H x W = {oh} x {ow} (1/{net.strides[0]} '
                           f'of the {size[-2]} x {size[-1]} input), one channel per class_names entry')
        rows[0]['to_labels'] = (f'resize the logits bilinearly (align_corners=False) to the input ({size[-2]} x '
                                f'{size[-1]}), then to the file\'s H x W (the preprocessing resized the whole file), '
                                'then argmax over the class dimension: the label of every file pixel '
                                '(zoo.layers.segment: head.logits, then head.decode)')
    elif task == 'classification':
        rows[0]['what'] = 'class logits (softmax for probabilities), one per class_names entry'
    elif task == 'language_modeling':
        rows[0]['what'] = 'next-token logits (batch, sequence, vocabulary)'
    elif task == 'denoising':
        rows[0]['what'] = 'the denoised image (the input minus the predicted noise), in the input\'s scale'
    return rows


def _task(name: str) -> str:
    if not name.startswith('timm/'):
        zoo.model_info(name)  # an unknown name: the registry's error, with close matches
    return zoo.tasks.task_of(name)


def _check_nms(name: str, nms: bool) -> None:
    task = _task(name)  # an unknown name fails here, with close matches
    if nms and task != 'detection':
        raise ValueError(f"--nms puts a detector's decode and NMS in the graph; {name} is a "
                         f"{task.replace('_', ' ')} model")


def _opset(path: Path) -> int | None:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ('', 'ai.onnx')), None)


def _int8_calibration(args, dm) -> list | None:
    """``--int8``: the calibration inputs, the first images of the recipe's training split (None without it)."""
    if not getattr(args, 'int8', False):
        return None
    if args.format != 'onnx':
        raise ValueError('--int8 writes an ONNX Runtime int8 (QDQ) graph: use --format onnx')
    if dm is None:
        raise ValueError('--int8 calibrates on the training images of a recipe: export a zoo fit checkpoint '
                         '(its run config names the data) or -c CONFIG, not a random initialisation or bare weights')
    from zoo._quantize import training_calibration
    return training_calibration(dm)


def _export_int8(net: nn.Module, out: Path, example: torch.Tensor, nms: bool, calibration: list) -> dict:
    """The float graph exported beside ``out``, quantized for ONNX Runtime into ``out`` (``zoo._quantize``), the
    float file removed; what the card records of the quantization."""
    import tempfile

    from zoo._quantize import float_modules, int8_fraction, quantize_onnx
    from zoo._runtime import _graph_module
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:  # on out's disk, so the last step is a rename
        tmp = Path(tmp)
        zoo.export(net, tmp / 'float.onnx', example, nms=nms)
        keep = float_modules(net, _graph_module(net, nms))
        quantize_onnx(tmp / 'float.onnx', tmp / 'int8.onnx', calibration, keep_float=keep)
        quantized, weighted = int8_fraction(tmp / 'int8.onnx')
        os.replace(tmp / 'int8.onnx', out)
    return {'runtime': 'onnxruntime', 'format': 'QDQ, per-channel int8 weights, uint8 activations',
            'calibration_images': sum(len(x) for x in calibration), 'calibration_split': 'train',
            'float_modules': list(keep), 'quantized_nodes': quantized, 'weighted_nodes': weighted}


def export_command(args) -> int:
    """The ``zoo export`` subcommand (``recipes/main.py`` parses the arguments)."""
    if bool(args.name) == bool(args.config):
        raise ValueError('give a model NAME or -c CONFIG (a recipe, whose run checkpoint is exported), not '
                         + ('both' if args.name else 'neither'))
    if args.random_init and (args.config or args.ckpt_path):
        raise ValueError('--random-init exports a NAME\'s seeded initialisation; it takes no '
                         + ('-c CONFIG' if args.config else '--ckpt_path') + ' (which gives trained weights)')
    weights = args.weights
    if weights != 'auto' and args.random_init:
        raise ValueError(f'--weights {weights} chooses among a checkpoint\'s weights; --random-init has none')
    if args.seed is not None and not args.random_init:
        raise ValueError('--seed seeds the weights of --random-init: pass --random-init too, or drop --seed')
    run_root = args.run_root or os.environ.get('ZOO_RUNS', 'runs')
    cfg, recipe, stem = None, None, None
    if args.config:
        recipe, cfg = _recipe(args.config)
        stem = recipe.stem
    init = dict((cfg or {}).get('model', {}).get('init_args') or {})
    name = args.name or init.get('name')
    if name:
        _check_nms(name, args.nms)
    ckpt = _checkpoint(args.ckpt_path or ('best' if args.config else None), stem, run_root)
    if ckpt is None and not args.random_init:
        raise ValueError(f'{name} has no trained weights to export: give --ckpt_path FILE (a zoo fit .ckpt, or '
                         f'weights for {name}) or -c CONFIG (a recipe\'s run), or pass --random-init to export a '
                         'random initialisation seeded by --seed (default 0)')
    if ckpt is not None and ckpt.suffix == '.ckpt':
        net, created = _from_lightning(ckpt, name, (cfg or {}).get('model', {}).get('class_path'), weights)
        _check_nms(created['name'], args.nms)
    else:
        if not name:
            raise ValueError(f'-c {args.config}: the recipe names no model (model.init_args.name)')
        kwargs = dict(init.get('model_args') or {})
        if ckpt is None:  # --random-init: seeded, so that zoo.create after the same seed rebuilds these weights
            seed = args.seed or 0
            torch.manual_seed(seed)
            net = zoo.create(name, **kwargs)
            created = {'name': name, 'kwargs': kwargs, 'weights': 'random-init', 'seed': seed}
            print(f'zoo export: warning: {name} has random weights (--random-init): torch.manual_seed({seed}); '
                  f'zoo.create({name!r}) rebuilds them', file=sys.stderr)
        else:
            net = zoo.create(name, checkpoint=str(ckpt), weights=weights, **kwargs)
            created = {'name': name, 'kwargs': kwargs, 'weights': net.zoo_weights}
    net.eval()

    suffix = '.onnx' if args.format == 'onnx' else '.pt2'
    out = Path(args.out) if args.out else Path(f'{stem or name.replace("/", "_")}{suffix}')
    if out.is_dir():
        out = out / f'{stem or name.replace("/", "_")}{suffix}'
    card_path = out.with_name(out.name + '.json')
    existing = [p for p in (out, card_path) if p.exists()]
    if existing and not args.overwrite:
        raise ValueError(f'{existing[0]} exists; nothing was written (pass --overwrite to replace it, or --out '
                              'another path)')

    run_config_file, run_cfg = _run_config(ckpt)
    config, config_file = (run_cfg, run_config_file) if run_cfg is not None else (cfg, recipe)
    task = _task(created['name'])
    kw = created['kwargs']
    size = zoo.tasks.input_size(net, img_size=args.img_size or kw.get('img_size'), in_chans=kw.get('in_chans'),
                                task=task)
    example = zoo.tasks.example_input(net, size, 2, task)
    dm = _data_module(config)
    prep = _preprocessing(task, dm, size, dict(getattr(net, 'pretrained_cfg', None) or {}))
    outputs = _outputs(net, example, args.nms, task, size)  # before anything is written: a failure leaves nothing
    dynamic_size = getattr(args, 'dynamic_size', False)
    if dynamic_size and args.int8:
        raise ValueError('--int8 calibrates one graph at the traced size; it does not combine with --dynamic-size')
    calibration = _int8_calibration(args, dm)
    from zoo._console import progress

    what = f'exporting {created["name"]} to ' + ('ONNX (dynamo)' if args.format == 'onnx' else 'pt2 (torch.export)')
    try:
        with progress(what, 'zoo export'):
            if calibration is None:
                zoo.export(net, out, example, format=args.format, nms=args.nms, dynamic_size=dynamic_size)
            else:
                int8 = _export_int8(net, out, example, args.nms, calibration)
    except (ValueError, TypeError):
        raise
    except Exception as e:        # the exporter's own errors (an op it cannot capture): one line, nothing left
        from zoo.eval.bench import error_summary

        out.unlink(missing_ok=True)
        raise ValueError(f'{created["name"]} could not be exported to {args.format}: {error_summary(e)}') from None

    from zoo._runtime import size_stride

    card = {
        'file': out.name, 'format': args.format, 'opset': _opset(out) if args.format == 'onnx' else None,
        'input': {'name': 'input', 'shape': ['batch', size[0], 'height', 'width'] if dynamic_size else ['batch', *size],
                  'dtype': str(example.dtype).replace('torch.', ''), 'dynamic_batch': True,
                  'dynamic_size': bool(dynamic_size),
                  'size_multiple': size_stride(net) if dynamic_size else None},
        'preprocessing': prep,
        'mean': prep.get('mean') if prep else None, 'std': prep.get('std') if prep else None,
        'normalisation_from': None if not prep or prep.get('mean') is None else (
            f'data ({type(dm).__name__})' if dm is not None else 'model pretrained_cfg'),
        'class_names': _class_names(dm) if dm is not None else None,
        'num_classes': getattr(net, 'num_classes', None),
        'task': task,
        'nms': bool(args.nms),
        'int8': int8 if calibration is not None else None,
        'outputs': outputs,
        'model': created, 'recipe': str(recipe) if recipe else None, 'checkpoint': str(ckpt) if ckpt else None,
        'run': str(run_config_file.parent) if run_config_file else None,
        'config_file': str(config_file) if config_file else None, 'config': config,
        'zoo_version': zoo.__version__, 'torch_version': torch.__version__,
    }
    card_path.write_text(json.dumps(card, indent=2, default=str) + '\n')
    print(f'zoo export: wrote {out} and {card_path}')
    return 0
