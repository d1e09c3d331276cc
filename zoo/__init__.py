"""zoo: interchangeable neural-network blocks, faithful model families and the tools to compare them.

>>> import zoo
>>> zoo.list_models('poolformer*')
>>> m = zoo.create('poolformer_s12', num_classes=10)
>>> zoo.model_info('poolformer_s12').params
11915176

Importing zoo registers every block and model; it imports torch and einops, not Lightning,
Optuna, torch._dynamo or timm (those load when a feature needs them).
"""
import os as _os

# In a source checkout, layers/, recipes/, datasets/ and eval/ sit beside zoo/ and are installed as
# zoo.layers, zoo.recipes, ... (pyproject's package-dir). Resolve them from this checkout too, so
# plain `pytest` and a second work tree never pick up another checkout's editable install.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, 'pyproject.toml')) and _os.path.isdir(_os.path.join(_root, 'layers')):
    __path__.append(_root)

from . import layers  # noqa: F401  (register blocks first: families resolve them by name)
from ._registry import ModelInfo, families, list_models, model_info, register_model
from ._factory import create, load_checkpoint, read_state_dict
from . import metaformer  # noqa: F401  (register the families)
from . import tnt  # noqa: F401
from . import raftmlp, stripmlp  # noqa: F401
from . import resnet, vgg, dncnn  # noqa: F401  (classic CNN hosts for the conv blocks)
from . import lm  # noqa: F401  (causal LMs with Canon layers, issue 7)
from . import detection  # noqa: F401  (YOLOv8-style detector on any features_only backbone, issue 16)
from . import mamba_yolo  # noqa: F401  (Mamba-YOLO, issue 17)

__version__ = '0.1.0'
__all__ = ['create', 'list_models', 'model_info', 'families', 'register_model', 'ModelInfo', 'load_checkpoint',
           'read_state_dict', 'layers']
