"""A model as a Hugging Face model folder, and ``zoo.create('hf-hub:ORG/NAME')`` / ``zoo.create('local-dir:DIR')``.

The layout is timm's (``timm.models._hub.push_to_hf_hub`` / ``save_config_for_hf``, huggingface/pytorch-image-models):
``config.json`` with ``architecture`` (here the ``zoo.create`` name), ``num_classes``, ``num_features``,
``global_pool``, ``label_names``, ``model_args`` (the arguments that rebuild the network) and ``pretrained_cfg``
(input size, mean, std, ...), beside ``model.safetensors`` (the state dict, safetensors' ``save_file``). A folder
is read back by building ``zoo.create(architecture, **model_args)`` (the caller's arguments override, e.g.
``num_classes``) and loading ``model.safetensors`` through the one checkpoint loader (strict: every key and shape).

``hf-hub:`` downloads with ``huggingface_hub.snapshot_download``, so its cache (``HF_HOME``/``HF_HUB_CACHE``) and
``HF_HUB_OFFLINE=1`` apply; nothing else in zoo touches the network. huggingface_hub and safetensors are imported
inside the functions: ``import zoo`` stays light.
"""
from __future__ import annotations

import json
from pathlib import Path

CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
FOLDER_PREFIXES = ('hf-hub:', 'local-dir:')
# what a published folder's pretrained_cfg says about the input a caller should feed (timm's keys)
_SOURCE_KEYS = ('url', 'file', 'state_dict', 'hf_hub_id', 'hf_hub_filename', 'source', 'architecture', 'tag')
_INPUT_KEYS = ('input_size', 'mean', 'std', 'crop_pct', 'interpolation', 'fixed_input_size', 'min_input_size')


def folder_config(model, name: str, args: dict, *, input_size=None, mean=None, std=None,
                  label_names: list[str] | None = None, **extra) -> dict:
    """The ``config.json`` of ``model`` in timm's layout: ``zoo.create(name, **args)`` rebuilds it, and
    ``pretrained_cfg`` is the model's own, with the input size and normalisation the weights were trained with."""
    args = dict(args)
    head_arg = getattr(model, 'checkpoint_head_arg', None)   # a family with timm's and the official head (PoolFormer)
    if head_arg and head_arg not in args:  # say which one these weights were trained with: loading need not guess
        args[head_arg] = getattr(model, head_arg)
    try:
        json.dumps(args)
    except (TypeError, ValueError) as e:
        raise ValueError(f'{name}: the model arguments {args} cannot be written to config.json ({e})') from None
    # timm's filter_pretrained_cfg(remove_source=True, remove_null=True): where the weights came from is this folder
    cfg = {k: (list(v) if isinstance(v, tuple) else v)
           for k, v in dict(getattr(model, 'pretrained_cfg', None) or {}).items()
           if v is not None and k not in _SOURCE_KEYS and _plain(v)}
    for key, value in (('input_size', input_size), ('mean', mean), ('std', std)):
        if value is not None:
            cfg[key] = [float(v) if key != 'input_size' else int(v) for v in value]
    num_classes = getattr(model, 'num_classes', None)
    cfg['num_classes'] = num_classes
    if label_names and len(label_names) != num_classes:
        label_names = None  # names of another head (a fine-tuned model's data): they would mislabel the outputs
    out = {'architecture': name, 'num_classes': num_classes,
           'num_features': getattr(model, 'num_features', None)}
    pool = getattr(model, 'global_pool', None)
    if isinstance(pool, str) and pool:
        out['global_pool'] = pool
    if label_names:
        out['label_names'] = list(label_names)
        cfg['label_names'] = list(label_names)
    out['model_args'] = args
    out['pretrained_cfg'] = cfg
    out.update(extra)
    return out


def _plain(value) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def save_folder(model, folder: str | Path, config: dict) -> list[Path]:
    """Write ``config.json`` and ``model.safetensors`` of ``model`` into the existing ``folder`` (the caller writes
    into a temporary folder and renames it: see ``zoo publish``). Returns the two paths."""
    from safetensors.torch import save_file

    folder = Path(folder)
    # safetensors refuses tensors that share storage (tied weights); each entry gets its own contiguous copy
    state = {k: v.detach().to('cpu').contiguous().clone() for k, v in model.state_dict().items()}
    weights = folder / WEIGHTS_FILE
    save_file(state, str(weights), metadata={'format': 'pt'})  # 'pt': what transformers and timm write
    config_path = folder / CONFIG_FILE
    config_path.write_text(json.dumps(config, indent=2) + '\n')
    return [config_path, weights]


def resolve_folder(spec: str) -> Path:
    """The local folder of ``'hf-hub:ORG/NAME'`` (downloaded into, or found in, huggingface_hub's cache) or of
    ``'local-dir:DIR'``; a one-line error for a malformed name, a missing folder or a folder without config.json."""
    if spec.startswith('hf-hub:'):
        repo_id = spec[len('hf-hub:'):]
        revision = None
        if '@' in repo_id:                     # hf-hub:ORG/NAME@REVISION, as timm accepts it
            repo_id, revision = repo_id.split('@', 1)
        parts = repo_id.split('/')
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"{spec!r}: expected 'hf-hub:ORG/NAME' (a Hugging Face model repository), e.g. "
                             "'hf-hub:my-org/poolformer_tiny-digits'")
        import huggingface_hub

        try:
            folder = Path(huggingface_hub.snapshot_download(
                repo_id, revision=revision, allow_patterns=[CONFIG_FILE, WEIGHTS_FILE, 'README.md', '*.yaml']))
        except Exception as e:  # offline without a cached copy, no such repository, no network, no access
            raise FileNotFoundError(f'{spec}: could not get the repository ({type(e).__name__}: '
                                    f'{str(e).splitlines()[0] if str(e) else "no detail"}); with HF_HUB_OFFLINE=1 '
                                    'it must already be in the Hugging Face cache') from None
    elif spec.startswith('local-dir:'):
        folder = Path(spec[len('local-dir:'):]).expanduser()
        if not spec[len('local-dir:'):]:
            raise ValueError("'local-dir:' needs a folder: 'local-dir:DIR' (one `zoo publish` wrote)")
        if not folder.is_dir():
            raise FileNotFoundError(f'{spec}: no such folder (expected one `zoo publish --out DIR` wrote, with '
                                    f'{CONFIG_FILE} and {WEIGHTS_FILE})')
    else:
        raise ValueError(f'{spec!r} is not a model folder name; expected one of: '
                         + ', '.join(p + ('ORG/NAME' if p == 'hf-hub:' else 'DIR') for p in FOLDER_PREFIXES))
    for needed in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / needed).is_file():
            raise FileNotFoundError(f'{spec}: {folder} has no {needed} (a zoo model folder holds {CONFIG_FILE} and '
                                    f'{WEIGHTS_FILE}, as `zoo publish` writes them)')
    return folder


def read_config(folder: Path, spec: str) -> dict:
    try:
        cfg = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f'{spec}: {CONFIG_FILE} is not readable JSON ({e})') from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get('architecture'), str):
        raise ValueError(f'{spec}: {CONFIG_FILE} names no architecture (a zoo model folder\'s config.json has '
                         '"architecture" and "model_args")')
    return cfg


def create_from_folder(spec: str, **overrides):
    """``zoo.create('hf-hub:ORG/NAME' | 'local-dir:DIR', **overrides)``: the folder's network with its weights."""
    from ._factory import create

    folder = resolve_folder(spec)
    cfg = read_config(folder, spec)
    args = {**dict(cfg.get('model_args') or {}), **overrides}
    # num_classes other than the folder's: a new, freshly initialised classifier (load_checkpoint's new_head)
    model = create(cfg['architecture'], checkpoint=str(folder / WEIGHTS_FILE), **args)
    saved = dict(cfg.get('pretrained_cfg') or {})
    new_head = 'num_classes' in overrides and overrides['num_classes'] != cfg.get('num_classes')
    keep = {k: (tuple(v) if isinstance(v, list) and k != 'label_names' else v) for k, v in saved.items()
            if k in _INPUT_KEYS or (k == 'label_names' and not new_head)}
    if 'in_chans' in overrides:        # another input: the folder's input size and normalisation do not apply
        keep = {k: v for k, v in keep.items() if k == 'label_names'}
    source = {'source': 'hf-hub', 'hf_hub_id': spec[len('hf-hub:'):]} if spec.startswith('hf-hub:') else \
        {'source': 'local-dir', 'file': str(folder)}
    model.pretrained_cfg = model.default_cfg = {**dict(getattr(model, 'pretrained_cfg', None) or {}), **keep,
                                                **source}
    model.zoo_folder = str(folder)
    return model
