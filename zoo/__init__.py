"""zoo: interchangeable neural-network blocks, faithful model families and the tools to compare them.

>>> import zoo
>>> zoo.list_models('poolformer*')
>>> m = zoo.create('poolformer_s12', num_classes=10)
>>> zoo.model_info('poolformer_s12').params
11915176
>>> fast = zoo.optimize(m)                      # torch.compile; 'onnxruntime', 'openvino' (docs/runtimes.md)
>>> zoo.export(m, 'm.onnx', torch.randn(2, 3, 224, 224))
>>> zoo.create('local-dir:tiny_digits')              # a folder `zoo publish` wrote; 'hf-hub:ORG/NAME' (docs/sharing.md)
>>> zoo.tasks.get('segmentation').metric        # 'val/miou': a task is one registered object (zoo/tasks.py)

``import zoo`` itself imports nothing heavy (not even torch): the families register on the first call
that needs the registry (``list_models``, ``model_info``, ``create``, ``families``) or when a family
module is imported, and ``zoo.layers``/``zoo.create`` load on first use (PEP 562). So the ``zoo``
console script answers ``--help`` without building a model. Lightning, Optuna, torch._dynamo and timm
load only when a feature needs them.

Layering (enforced by tests/test_layering.py): layers -> zoo (families, registry) -> eval (measure,
store) -> recipes (train, sweep, the command line, the demo).
"""
import importlib as _importlib
import os as _os

# In a source checkout, layers/, recipes/, datasets/ and eval/ sit beside zoo/ and are installed as
# zoo.layers, zoo.recipes, ... (pyproject's package-dir). An editable install resolves those names to
# the checkout it was installed from; this finder, searched first, resolves exactly those four names
# from this checkout, so a second work tree (and plain `pytest` from any checkout) uses its own folders.
# Nothing else under the root (tests/, docs/, notebooks/) becomes part of the package.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, 'pyproject.toml')) and _os.path.isdir(_os.path.join(_root, 'layers')):
    import importlib.abc as _abc
    import importlib.util as _util
    import sys as _sys

    class _CheckoutFolders(_abc.MetaPathFinder):
        folders = {f'{__name__}.{d}': _os.path.join(_root, d) for d in ('layers', 'recipes', 'datasets', 'eval')}

        def find_spec(self, name, path=None, target=None):
            folder = self.folders.get(name)
            if folder is None:
                return None
            return _util.spec_from_file_location(name, _os.path.join(folder, '__init__.py'),
                                                 submodule_search_locations=[folder])

    _sys.meta_path.insert(0, _CheckoutFolders())

from . import tasks  # noqa: E402  (the task registry: light, no torch)
from ._registry import (FAMILY_MODULES, ModelInfo, ReleasedWeights, families, list_models,  # noqa: E402
                        model_info, register_model)

_LAZY = {'create': '_factory', 'create_with_optional': '_factory', 'load_checkpoint': '_factory',
         'read_weights': '_factory', 'read_state_dict': '_factory',
         'save_folder': '_hub', 'folder_config': '_hub', 'FOLDER_PREFIXES': '_hub',
         'classifier_prefix': '_factory', 'remap_checkpoint': '_factory',
         'ClassifierBase': '_builder', 'optimize': '_runtime', 'export': '_runtime', 'RUNTIMES': '_runtime'}
_SUBPACKAGES = ('layers', 'eval', 'recipes', 'datasets', *FAMILY_MODULES)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(_importlib.import_module(f'{__name__}.{_LAZY[name]}'), name)
    elif name in _SUBPACKAGES:
        value = _importlib.import_module(f'{__name__}.{name}')
    else:
        raise AttributeError(f"module 'zoo' has no attribute {name!r}")
    globals()[name] = value  # cache: later look-ups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))


__version__ = '0.1.0'
__all__ = ['create', 'create_with_optional', 'list_models', 'model_info', 'families', 'register_model', 'ModelInfo',
           'ReleasedWeights', 'load_checkpoint', 'read_weights', 'read_state_dict', 'save_folder', 'folder_config',
           'FOLDER_PREFIXES', 'classifier_prefix', 'remap_checkpoint', 'layers', 'ClassifierBase', 'optimize', 'export',
           'RUNTIMES', 'tasks']
