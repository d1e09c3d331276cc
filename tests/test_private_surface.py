"""The private names zoo takes from torch, Lightning and timm live in one compatibility module per library (issue
44, item 4): ``layers/_torch_compat.py``, ``recipes/_lightning_compat.py``, ``zoo/_timm_compat.py``.

Two checks. (a) Every private name a compatibility module relies on still resolves and still means what zoo
assumes; a failure names the private name and the installed library's version. (b) No other module of zoo uses a
private name of those libraries: the source of ``zoo/ layers/ recipes/ eval/ datasets/`` is read with ``ast``
(comments and docstrings are not code, so they may mention private names)."""
from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import inspect
import re
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ('zoo', 'layers', 'recipes', 'eval', 'datasets')
COMPAT = {'torch': 'layers/_torch_compat.py', 'lightning': 'recipes/_lightning_compat.py',
          'timm': 'zoo/_timm_compat.py'}
# import roots that belong to each library
LIBRARY_OF = {'torch': 'torch', 'lightning': 'lightning', 'pytorch_lightning': 'lightning',
              'lightning_fabric': 'lightning', 'lightning_utilities': 'lightning', 'timm': 'timm'}


def _version(library: str) -> str:
    return importlib.import_module(library).__version__


@contextlib.contextmanager
def _contract(library: str, name: str):
    """Any error or failed assertion inside becomes one message naming ``name`` and the library's version."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - an ImportError, AttributeError or AssertionError alike
        pytest.fail(f'{library} {_version(library)}: the private name {name} no longer resolves or no longer means '
                    f'what zoo assumes ({type(error).__name__}: {error}); update {COMPAT[library]}', pytrace=False)


def _resolve(dotted: str):
    """The object a dotted path names: the longest importable module prefix, then attributes."""
    parts = dotted.split('.')
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module('.'.join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(f'no module of {dotted} imports')


# ---- (a) each compatibility module's private names still resolve and mean what zoo assumes ---------------------

TORCH_NAMES = ['torch.fx._symbolic_trace.is_fx_symbolic_tracing', 'torch.nn.modules.batchnorm._BatchNorm',
               'torch.nn.modules.conv._ConvNd', 'torch.utils._python_dispatch._get_current_dispatch_mode',
               'torch._guards.detect_fake_mode', 'torch._inductor.custom_graph_pass.CustomGraphPass',
               'torch._inductor.config.freezing', 'torch._inductor.config.post_grad_custom_pre_pass',
               'torch._inductor.config.patch', 'torch._inductor.list_mode_options',
               'torch.utils._pytree.tree_flatten', 'torch.utils._pytree.tree_unflatten',
               'torch._higher_order_ops.scan.scan', 'torch.nn.Module._compiled_call_impl',
               'torch.nn.Conv1d._conv_forward', 'torch.nn.Conv2d._conv_forward', 'torch.nn.Conv3d._conv_forward',
               'torch.nn.Module._load_from_state_dict']
LIGHTNING_NAMES = ['lightning.pytorch.utilities.imports._RICH_AVAILABLE',
                   'lightning.pytorch.cli.LightningCLI._parse_ckpt_path']
TIMM_NAMES = ['timm.models._features.feature_take_indices', 'timm.models._features.FeatureGetterNet']


@pytest.mark.parametrize('name', TORCH_NAMES + LIGHTNING_NAMES + TIMM_NAMES)
def test_private_name_resolves(name):
    library = LIBRARY_OF[name.split('.')[0]]
    with _contract(library, name):
        _resolve(name)


def test_torch_private_names_mean_what_zoo_assumes():
    from torch.utils.flop_counter import FlopCounterMode

    from zoo.layers import _torch_compat as tc

    with _contract('torch', 'torch.fx._symbolic_trace.is_fx_symbolic_tracing'):
        seen = []

        class Probe(nn.Module):
            def forward(self, x):
                seen.append(tc.is_fx_symbolic_tracing())
                return x + 1

        torch.fx.symbolic_trace(Probe())
        Probe()(torch.zeros(1))
        assert seen == [True, False]
    with _contract('torch', 'torch.utils._python_dispatch._get_current_dispatch_mode'):
        with FlopCounterMode(display=False):
            assert tc.dispatch_mode_active()
        assert not tc.dispatch_mode_active()
    with _contract('torch', 'torch._guards.detect_fake_mode'):
        assert tc.detect_fake_mode([torch.zeros(1)]) is None
    with _contract('torch', 'torch._inductor.custom_graph_pass.CustomGraphPass'):
        assert {'__call__', 'uuid'} <= set(tc.custom_graph_pass().__abstractmethods__)
    with _contract('torch', 'torch._inductor.config'):
        config = tc.inductor_config()
        with config.patch({'freezing': True}):
            assert config.freezing is True
    with _contract('torch', 'torch._inductor.list_mode_options'):
        assert isinstance(tc.inductor_mode_options('max-autotune'), dict)
    with _contract('torch', 'torch.utils._pytree'):
        tree = (torch.zeros(1), [torch.ones(2), {'a': torch.zeros(3)}])
        leaves, spec = tc.tree_flatten(tree)
        assert len(leaves) == 3 and tc.tree_unflatten(leaves, spec)[1][1]['a'] is leaves[2]
    with _contract('torch', 'torch._higher_order_ops.scan.scan'):
        assert callable(tc.higher_order_scan())
    with _contract('torch', 'torch.nn.modules.batchnorm._BatchNorm, torch.nn.modules.conv._ConvNd'):
        assert all(issubclass(c, tc.BatchNormBase) for c in (nn.BatchNorm1d, nn.BatchNorm2d, nn.SyncBatchNorm))
        assert all(issubclass(c, tc.ConvBase) for c in (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose2d))
    with _contract('torch', 'torch.nn.Conv2d._conv_forward'):
        conv = nn.Conv2d(2, 3, 3, padding=1, padding_mode='reflect')
        x = torch.randn(1, 2, 5, 5)
        torch.testing.assert_close(tc.conv_forward(conv, x, conv.weight, conv.bias), conv(x))
    with _contract('torch', 'torch.Tensor._version'):
        t = torch.zeros(2)
        before = tc.version_counter(t)
        t.add_(1)
        assert tc.version_counter(t) > before
    with _contract('torch', 'torch.optim.lr_scheduler.LRScheduler._last_lr'):
        scheduler = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0),
                                                      lambda step: 1.0)
        tc.set_last_lr(scheduler, [0.5])
        assert scheduler.get_last_lr() == [0.5]
    with _contract('torch', "a state dict's _metadata"):
        sd = nn.Sequential(nn.Linear(1, 1)).state_dict()
        assert {'', '0'} <= set(tc.state_dict_metadata(sd))
        tc.set_state_dict_metadata(sd, {'x': {}})
        assert tc.state_dict_metadata(sd) == {'x': {}}
    with _contract('torch', "torch.compile's module attribute _orig_mod"):
        assert all(k.startswith(tc.COMPILED_PREFIX) for k in torch.compile(nn.Linear(1, 1)).state_dict())
    with _contract('torch', 'torch.nn.Module._compiled_call_impl'):
        lin = nn.Linear(1, 1)
        lin.compile()
        assert lin._compiled_call_impl is not None
        tc.drop_compiled_forward(lin)
        assert lin._compiled_call_impl is None
    with _contract('torch', 'torch.nn.Module._load_from_state_dict'):
        calls = []

        class Remapped(tc.LoadStateDictHook, nn.Linear):
            def remap_state_dict(self, state_dict, prefix, error_msgs):
                calls.append(prefix)
                state_dict[prefix + 'weight'] = state_dict.pop(prefix + 'w')
                return True

        outer = nn.Sequential(Remapped(1, 1))
        outer.load_state_dict({'0.w': torch.full((1, 1), 2.0), '0.bias': torch.zeros(1)})
        assert calls == ['0.'] and outer[0].weight.item() == 2.0


def test_lightning_private_names_mean_what_zoo_assumes():
    from lightning.pytorch.cli import LightningCLI

    from zoo.recipes._lightning_compat import CkptPathHook, rich_available

    with _contract('lightning', 'lightning.pytorch.utilities.imports._RICH_AVAILABLE'):
        assert isinstance(rich_available(), bool)
    with _contract('lightning', 'lightning.pytorch.cli.LightningCLI._parse_ckpt_path'):
        # the step must still run in __init__, after parsing and before instantiation, and take no arguments
        init = inspect.getsource(LightningCLI.__init__)
        assert 'self._parse_ckpt_path()' in init
        assert init.index('self.parse_arguments(') < init.index('self._parse_ckpt_path()') \
            < init.index('self.instantiate_classes()')
        assert list(inspect.signature(LightningCLI._parse_ckpt_path).parameters) == ['self']
        assert CkptPathHook._parse_ckpt_path is not LightningCLI._parse_ckpt_path


def test_timm_private_names_mean_what_zoo_assumes():
    from zoo._timm_compat import feature_getter_net, feature_take_indices

    with _contract('timm', 'timm.models._features.feature_take_indices'):
        assert feature_take_indices(4, None) == ([0, 1, 2, 3], 3) and feature_take_indices(4, 2) == ([2, 3], 3)
    with _contract('timm', 'timm.models._features.FeatureGetterNet'):
        getter = feature_getter_net()
        assert hasattr(getter, 'forward') and 'prune' in getter.__init__.__code__.co_varnames


# ---- (b) nowhere else: a scan of zoo's source ---------------------------------------------------------------------

# The one documented exception (layers/_torch_compat.py's docstring): the unpickler's safe list names the globals a
# torch.save stream asks for; they map to zoo's own functions.
EXCEPTIONS = {('zoo/_factory.py', 'torch._utils')}
# Operators of torch's dispatcher with a leading underscore are not Python names: zoo.layers.onednn asks for its own
# at run time and falls back to the plain ops (see layers/_torch_compat.py's docstring).
OPERATORS = {'_linear_pointwise', '_convolution_pointwise', '_reorder_linear_weight', '_reorder_convolution_weight',
             '_mkl_linear', '_scaled_dot_product_flash_attention_for_cpu'}
# Private names of other libraries (not issue 44's three), which zoo reaches on purpose.
OTHER_LIBRARIES = {
    '_actions', '_group_actions', '_subparsers', '_name_parser_map', '_subcommands_action',  # argparse, jsonargparse
    '_copy',                                                                              # SQLAlchemy Column
    '_call_kernel', '_check_integrity', '_load_meta',                                      # torchvision
}
# Classes of zoo whose base is chosen at run time (the scan cannot read it from the source).
DYNAMIC_BASES = {'ZooModelSummary': ['lightning.pytorch.callbacks.ModelSummary',
                                     'lightning.pytorch.callbacks.RichModelSummary']}


def _private(name: str) -> bool:
    return name.startswith('_') and not (name.startswith('__') and name.endswith('__'))


def _library(dotted: str) -> str | None:
    return LIBRARY_OF.get(dotted.split('.')[0])


def _sources() -> dict[str, ast.Module]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p))
            for folder in FOLDERS for p in sorted((ROOT / folder).rglob('*.py'))}


def _torch_object_privates() -> set[str]:
    """Private attributes of the torch objects zoo handles everywhere: a module (class and instance), its state dict
    (``_metadata``), a compiled module (``_orig_mod``) and a tensor's data attributes (``_version``)."""
    module = nn.Linear(1, 1)
    names = {n for obj in (nn.Module, module, module.state_dict(), torch.compile(module)) for n in dir(obj)}
    tensor = torch.zeros(1)
    names |= {n for n in dir(tensor) if _private(n) and not callable(getattr(tensor, n, None))}
    return {n for n in names if _private(n)}


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the library path it stands for (``nn`` -> ``torch.nn``, ``L`` -> ``lightning``)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _library(a.name):
                    out[a.asname or a.name.split('.')[0]] = a.name if a.asname else a.name.split('.')[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _library(node.module):
            for a in node.names:
                out[a.asname or a.name] = f'{node.module}.{a.name}'
    return out


def _chain(node: ast.Attribute, aliases: dict[str, str]) -> str | None:
    """``nn.modules.batchnorm._BatchNorm`` -> ``torch.nn.modules.batchnorm._BatchNorm`` (None: not a library's)."""
    parts = [node.attr]
    value = node.value
    while isinstance(value, ast.Attribute):
        parts.append(value.attr)
        value = value.value
    if isinstance(value, ast.Name) and value.id in aliases:
        return '.'.join([aliases[value.id], *reversed(parts)])
    return None


def _our_names(trees) -> set[str]:
    """Private names zoo defines itself: functions, classes, variables, arguments, keywords, attributes it assigns
    and string keys (``df['_args']``)."""
    out = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                out.add(node.id)
            elif isinstance(node, ast.arg):
                out.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                out.add(node.arg)
            elif isinstance(node, ast.ImportFrom) and not (node.level == 0 and node.module and _library(node.module)):
                out.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                out.add(node.attr)  # a library's own attribute assigned by zoo is caught by the other rules
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and \
                    isinstance(node.slice.value, str):
                out.add(node.slice.value)
            elif isinstance(node, ast.Dict):
                out.update(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    return {n for n in out if _private(n)}


def _class_bases(trees) -> dict[str, list[str]]:
    """Each class of zoo -> its bases: library paths (``torch.nn.Module``) or names of zoo's classes."""
    out = {name: list(bases) for name, bases in DYNAMIC_BASES.items()}
    for tree in trees:
        aliases = _aliases(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = out.setdefault(node.name, [])
                for base in node.bases:
                    dotted = (aliases.get(base.id, base.id) if isinstance(base, ast.Name) else
                              _chain(base, aliases) if isinstance(base, ast.Attribute) else None)
                    if dotted:
                        bases.append(dotted)
    return out


@functools.cache
def _privates_of(dotted: str) -> frozenset[str]:
    """A library class's private attributes: those of the class (``dir``) and those its library ancestors' code
    sets on an instance (``self._last_lr = ...``), which ``dir`` of the class misses."""
    cls = _resolve(dotted)
    names = set(dir(cls))
    for klass in getattr(cls, '__mro__', ()):
        if _library(klass.__module__ or ''):
            with contextlib.suppress(OSError, TypeError):
                names |= set(re.findall(r'self\.(_\w+)\s*(?::[^=\n]*)?=(?!=)', inspect.getsource(klass)))
    return frozenset(n for n in names if _private(n))


def _inherited_privates(bases: dict[str, list[str]]):
    """class name -> the private attributes it inherits from torch, Lightning or timm (through zoo's classes too)."""
    def of(name: str, seen: tuple) -> set[str]:
        out = set()
        for base in bases.get(name, []):
            if _library(base):
                out |= _privates_of(base)
            elif base not in seen:
                out |= of(base, (*seen, name))
        return out
    return {name: of(name, ()) for name in bases}


def _uses(path: str, tree: ast.Module, ours: set[str], theirs: set[str], inherited: dict[str, set[str]]) -> list[str]:
    """Every use of a private name of torch, Lightning or timm in one module, as 'path:line: what'. ``theirs``:
    private attributes of the torch objects zoo handles; ``inherited``: those each class gets from its bases."""
    aliases, found = _aliases(tree), []
    docstrings, owner = set(), {}
    for node in ast.walk(tree):  # breadth first: an inner class's nodes are given to it after its outer class's
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body and \
                isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            docstrings.add(id(node.body[0].value))
        if isinstance(node, ast.ClassDef):
            owner.update((id(inner), node.name) for inner in ast.walk(node) if inner is not node)

    def library_private(name: str, node) -> bool:
        return _private(name) and name not in OTHER_LIBRARIES and name not in OPERATORS and (
            name not in ours or name in theirs or name in inherited.get(owner.get(id(node)), ()))

    def hit(node, what):
        found.append(f'{path}:{node.lineno}: {what}')

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _library(a.name) and any(_private(p) for p in a.name.split('.')):
                    hit(node, f'import {a.name}')
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _library(node.module):
            for a in node.names:
                if any(_private(p) for p in node.module.split('.')) or _private(a.name):
                    hit(node, f'from {node.module} import {a.name}')
        elif isinstance(node, ast.Attribute):
            dotted = _chain(node, aliases)
            if dotted and dotted.startswith('torch.ops.'):
                if _private(node.attr) and node.attr not in OPERATORS:
                    hit(node, f'{dotted} (an operator zoo has not listed)')
            elif dotted and _private(node.attr):
                hit(node, dotted)
            elif library_private(node.attr, node):
                hit(node, f'.{node.attr}')
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ('getattr', 'setattr', 'hasattr', 'delattr') and len(node.args) > 1 and \
                isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            if library_private(node.args[1].value, node):
                hit(node, f'{node.func.id}(..., {node.args[1].value!r})')
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name) and \
                node.name in inherited.get(owner.get(id(node)), ()):
            hit(node, f'def {node.name} (overrides a private method of a library base class)')
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings and \
                re.fullmatch(r'[A-Za-z_]\w*(\.\w+)+', node.value) and _library(node.value) and \
                any(_private(p) for p in node.value.split('.')) and (path, node.value) not in EXCEPTIONS:
            hit(node, f'the string {node.value!r}')
    return found


def test_private_names_are_used_only_in_the_compatibility_modules():
    trees = _sources()
    compat = set(COMPAT.values())
    ours = _our_names(tree for path, tree in trees.items() if path not in compat)
    inherited = _inherited_privates(_class_bases(trees.values()))
    theirs = _torch_object_privates()
    found = [use for path, tree in trees.items() if path not in compat
             for use in _uses(path, tree, ours, theirs, inherited)]
    assert not found, ('private names of torch, Lightning or timm outside their compatibility modules '
                       f'({", ".join(sorted(compat))}); move each there, with a docstring and a check in this file:\n'
                       + '\n'.join(found))


def test_the_scan_sees_what_it_must():
    """The scan itself: each kind of use it must catch, in a made-up module, and no comment or docstring."""
    source = '''
import torch
from torch import nn
from torch.utils._pytree import tree_flatten
import torch._dynamo
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE
from timm.models import _features

def f(module, t):
    """torch._inductor in a docstring is prose."""
    module._compiled_call_impl = None   # torch._inductor in a comment is not code
    x = nn.modules.batchnorm._BatchNorm
    y = torch.ops.mkldnn._unknown_op
    z = torch.ops.mkldnn._linear_pointwise
    return getattr(t, '_version'), 'torch._C._foo'

class Net(nn.Module):
    def _apply(self, fn):
        return self._own(fn)
'''
    tree = ast.parse(source)
    inherited = _inherited_privates(_class_bases([tree]))
    assert '_apply' in inherited['Net'] and '_own' not in inherited['Net']
    found = _uses('made_up.py', tree, {'_own', '_compiled_call_impl', '_version'}, {'_compiled_call_impl', '_version'},
                  inherited)
    text = '\n'.join(found)
    for expected in ('torch.utils._pytree', 'import torch._dynamo', '_RICH_AVAILABLE', 'timm.models import _features',
                     '._compiled_call_impl', 'torch.nn.modules.batchnorm._BatchNorm', 'torch.ops.mkldnn._unknown_op',
                     "getattr(..., '_version')", "'torch._C._foo'", 'def _apply'):
        assert expected in text, f'{expected} not caught:\n{text}'
    assert 'inductor' not in text and '_linear_pointwise' not in text and len(found) == 10, text
