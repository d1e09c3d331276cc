"""Imports flow one way: layers -> zoo (families, registry) -> eval (measure, store) -> recipes (train, sweep,
the command line, the demo); datasets feed recipes only. Checked twice: statically (every import statement of
every module, including the ones inside functions) and by what a fresh interpreter actually loads."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
# The studies at the root (benchmarks/, experiments/) are scripts, not installed: the package never imports them.
STUDIES = ('benchmarks', 'experiments')
# folder -> the zoo packages its modules may not import (anything above it in the flow)
FORBIDDEN = {
    'layers': ('zoo.eval', 'zoo.recipes', 'zoo.datasets', 'lightning', 'optuna', 'zoo.<family>', *STUDIES),
    'zoo': ('zoo.eval', 'zoo.recipes', 'zoo.datasets', 'lightning', 'optuna', 'torchmetrics', *STUDIES),
    'eval': ('zoo.recipes', 'zoo.datasets', 'lightning', 'optuna', 'torchmetrics', *STUDIES),
    'datasets': ('zoo.recipes', 'zoo.eval', 'optuna', *STUDIES),
    'recipes': STUDIES,
}
PACKAGE = {'layers': 'zoo.layers', 'zoo': 'zoo', 'eval': 'zoo.eval', 'datasets': 'zoo.datasets',
           'recipes': 'zoo.recipes'}


def _imports(path: Path, package: str) -> list[tuple[int, str]]:
    """Absolute names of every module imported anywhere in ``path`` (relative imports resolved)."""
    pkg = '.'.join((package, *path.parent.relative_to(ROOT).parts[1:]))  # e.g. zoo.eval.results
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.rsplit('.', node.level - 1)[0] if node.level > 1 else pkg
                mod = f'{base}.{node.module}' if node.module else base
                names = [f'{mod}.{a.name}' for a in node.names] if not node.module else [mod]
            else:
                mod = node.module
                names = [f'{mod}.{a.name}' for a in node.names] if mod == 'zoo' else [mod]
            out += [(node.lineno, n) for n in names]
    return out


def _family_modules() -> set[str]:
    from zoo._registry import FAMILY_MODULES
    return {f'zoo.{m}' for m in FAMILY_MODULES}


@pytest.mark.parametrize('folder', sorted(FORBIDDEN))
def test_no_import_runs_against_the_flow(folder):
    families = _family_modules()
    bad = []
    for path in sorted((ROOT / folder).rglob('*.py')):
        for line, name in _imports(path, PACKAGE[folder]):
            for banned in FORBIDDEN[folder]:
                hit = (name in families or name.startswith(tuple(f + '.' for f in families))) \
                    if banned == 'zoo.<family>' else (name == banned or name.startswith(banned + '.'))
                if hit:
                    bad.append(f'{path.relative_to(ROOT)}:{line} imports {name}')
    assert not bad, f'{folder}/ imports against the flow:\n' + '\n'.join(bad)


def test_every_family_module_is_registered_for_lazy_loading():
    listed = _family_modules()
    on_disk = {f'zoo.{p.stem}' for p in (ROOT / 'zoo').glob('*.py')
               if 'register_model(' in p.read_text() and not p.stem.startswith('_')}
    assert on_disk <= listed, f'add {sorted(on_disk - listed)} to zoo._registry.FAMILY_MODULES'


def _loaded(code: str) -> list[str]:
    code = f'import sys\n{code}\nprint("\\n".join(sorted(sys.modules)))'
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.split()


def test_model_and_eval_layers_load_no_training_code():
    evals = sorted(f'zoo.eval.{p.stem}' for p in (ROOT / 'eval').glob('*.py') if p.stem != '__init__')
    evals += sorted(f'zoo.eval.{p.name}' for p in (ROOT / 'eval').iterdir() if (p / '__init__.py').is_file())
    mods = _loaded('import zoo, zoo.layers\nzoo.list_models()\n' + '\n'.join(f'import {m}' for m in evals))
    assert set(evals) <= set(mods)
    heavy = [m for m in mods if m.split('.')[0] in ('lightning', 'pytorch_lightning', 'optuna', 'torchmetrics')
             or m.startswith(('zoo.recipes', 'zoo.datasets'))]
    assert not heavy, f'zoo / zoo.layers / zoo.eval loaded {heavy}'


def test_layers_load_no_family():
    mods = _loaded('import zoo.layers')
    assert not set(mods) & _family_modules()


def test_cli_help_and_list_load_no_lightning():
    """``zoo --help`` imports neither torch nor a family; ``zoo list``/``zoo info`` no Lightning."""
    mods = _loaded('from zoo.recipes.main import main\ntry:\n    main(["--help"])\nexcept SystemExit:\n    pass')
    assert 'torch' not in mods and not set(mods) & _family_modules()
    for argv in (['list'], ['info', 'poolformer_tiny'], ['list', '--blocks']):
        mods = _loaded(f'from zoo.recipes.main import main\nassert main({argv!r}) == 0')
        assert not [m for m in mods if m.split('.')[0] in ('lightning', 'optuna', 'zoo') and
                    m.startswith(('lightning', 'optuna', 'zoo.recipes.cli', 'zoo.datasets'))], argv


def test_the_block_registry_writes_nothing_onto_classes():
    import zoo.layers  # noqa: F401  (registers nn.GELU, nn.Identity, ... among others)
    assert not hasattr(nn.GELU, 'layout') and zoo.layers.layout_of('act', 'gelu') == 'any'
    assert zoo.layers.layout_of('token_mixer', 'pooling') == 'nchw'


def test_a_checkout_resolves_its_own_folders_and_only_those():
    """zoo.layers/recipes/datasets/eval come from this checkout (not another checkout's editable install);
    the rest of the root (tests/, docs/) is not part of the package."""
    code = ('import importlib, json, zoo, zoo.layers, zoo.eval, zoo.recipes, zoo.datasets\n'
            'print(json.dumps([m.__file__ for m in (zoo.layers, zoo.eval, zoo.recipes, zoo.datasets)]))\n'
            'try:\n    importlib.import_module("zoo.tests")\nexcept ModuleNotFoundError:\n    print("no zoo.tests")')
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    files, last = res.stdout.splitlines()
    assert all(f.startswith(str(ROOT / d)) for f, d in zip(json.loads(files), ('layers', 'eval', 'recipes', 'datasets')))
    assert last == 'no zoo.tests'
