"""``zoo export NAME|-c CONFIG [--ckpt_path best|last|PATH] --format onnx|pt2 [--nms] [--out PATH]``.

Writes the network as an ONNX file (``torch.onnx.export(..., dynamo=True)``, dynamic batch) or a ``torch.export``
program (``.pt2``) through ``zoo.export``, and a JSON card beside it (``<file>.json``): what a deployment needs to
feed the graph and read its output (input size, mean/std, class names, the output layout) and where it came from
(the zoo version, the model's creation arguments, the recipe and checkpoint, format and opset).

The checkpoint of a recipe is found as ``zoo test``/``zoo predict`` find it (``runs.resolve_checkpoint``,
``checkpointing.read_checkpoint``/``check_checkpoint_model``/``check_weights_fit``); a ``zoo fit`` checkpoint
carries the model's name, arguments and the sizes the data gave it, so the network is rebuilt from it and gets
the weights evaluation used (the EMA's when the run kept one). Nothing is overwritten without ``--overwrite``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

import zoo

from . import runs
from .checkpointing import check_checkpoint_model, check_weights_fit, read_checkpoint

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


def _from_lightning(path: Path, name: str | None, class_path: str | None) -> tuple[nn.Module, dict]:
    """The network of a ``zoo fit`` checkpoint (rebuilt from its hyper-parameters, its evaluated weights)."""
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
    sd = ckpt['state_dict']
    prefix = 'ema.module.' if any(k.startswith('ema.module.') for k in sd) else 'model.'
    net.load_state_dict({k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)})
    created = {'name': name, 'kwargs': {**{k: v for k, v in sizes.items() if v is not None}, **args},
               'weights': 'ema' if prefix == 'ema.module.' else 'model', 'epoch': ckpt.get('epoch'),
               'global_step': ckpt.get('global_step')}
    return net, created


def _data_card(cfg: dict | None) -> dict:
    """Normalisation and class names the recipe's DataModule declares (class attributes: nothing is loaded)."""
    data = (cfg or {}).get('data') or {}
    class_path = data.get('class_path') if isinstance(data, dict) else None
    if not class_path:
        return {}
    import importlib

    module, _, attr = class_path.rpartition('.')
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        return {}
    out = {'data': class_path}
    for key in ('mean', 'std'):
        value = getattr(cls, key, None)
        if isinstance(value, (int, float, tuple, list)):
            out[key] = list(value) if isinstance(value, (tuple, list)) else [value]
    names = getattr(cls, 'class_names', None) or getattr(cls, 'classes', None)
    if isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names):
        out['class_names'] = list(names)
    return out


def _opset(path: Path) -> int | None:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((o.version for o in model.opset_import if o.domain in ('', 'ai.onnx')), None)


def export_command(args) -> int:
    """The ``zoo export`` subcommand (``recipes/main.py`` parses the arguments)."""
    if bool(args.name) == bool(args.config):
        raise ValueError('give a model NAME or -c CONFIG (a recipe, whose run checkpoint is exported), not '
                         + ('both' if args.name else 'neither'))
    run_root = args.run_root or os.environ.get('ZOO_RUNS', 'runs')
    cfg, recipe, stem = None, None, None
    if args.config:
        recipe, cfg = _recipe(args.config)
        stem = recipe.stem
    init = dict((cfg or {}).get('model', {}).get('init_args') or {})
    name = args.name or init.get('name')
    ckpt = _checkpoint(args.ckpt_path or ('best' if args.config else None), stem, run_root)
    if ckpt is not None and ckpt.suffix == '.ckpt':
        net, created = _from_lightning(ckpt, name, (cfg or {}).get('model', {}).get('class_path'))
    else:
        if not name:
            raise ValueError(f'-c {args.config}: the recipe names no model (model.init_args.name)')
        kwargs = dict(init.get('model_args') or {})
        net = zoo.create(name, checkpoint=str(ckpt) if ckpt else None, **kwargs)
        created = {'name': name, 'kwargs': kwargs}
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

    info = zoo.model_info(created['name']) if not created['name'].startswith('timm/') else None
    size = tuple(info.input_size) if info is not None else tuple(net.pretrained_cfg.get('input_size', (3, 224, 224)))
    kw = created['kwargs']
    if len(size) == 3:
        img = args.img_size or kw.get('img_size')
        size = (kw.get('in_chans', size[0]), *((img, img) if isinstance(img, int) else img or size[1:]))
    from zoo.eval.profile import example_input

    example = example_input(net, size, 2, info.task if info else None)
    try:
        zoo.export(net, out, example, format=args.format, nms=args.nms)
    except (ValueError, TypeError):
        raise
    except Exception as e:        # the exporter's own errors (an op it cannot capture): one line, nothing left
        from zoo.eval.bench import error_summary

        out.unlink(missing_ok=True)
        raise ValueError(f'{created["name"]} could not be exported to {args.format}: {error_summary(e)}') from None

    pcfg = dict(getattr(net, 'pretrained_cfg', None) or {})
    data = _data_card(cfg)
    card = {
        'file': out.name, 'format': args.format, 'opset': _opset(out) if args.format == 'onnx' else None,
        'input': {'name': 'input', 'shape': ['batch', *size], 'dtype': str(example.dtype).replace('torch.', ''),
                  'dynamic_batch': True},
        'mean': data.get('mean') or list(pcfg.get('mean') or []) or None,
        'std': data.get('std') or list(pcfg.get('std') or []) or None,
        'normalisation_from': 'data' if data.get('mean') else ('model pretrained_cfg' if pcfg.get('mean') else None),
        'class_names': data.get('class_names'),
        'num_classes': getattr(net, 'num_classes', None),
        'task': info.task if info else 'classification',
        'nms': bool(args.nms),
        'outputs': ('(batch, max_det, 6): x1, y1, x2, y2, score, label (-1: empty) in input pixels' if args.nms else
                    'the network outputs (dense models: one map per level, decode and NMS not included)'
                    if hasattr(net, 'forward_raw') else 'logits' if info is None or info.task == 'classification'
                    else 'the model output'),
        'model': created, 'recipe': str(recipe) if recipe else None, 'checkpoint': str(ckpt) if ckpt else None,
        'config': cfg, 'zoo_version': zoo.__version__, 'torch_version': torch.__version__,
    }
    card_path.write_text(json.dumps(card, indent=2, default=str) + '\n')
    print(f'zoo export: wrote {out} and {card_path}')
    return 0
