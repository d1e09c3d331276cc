"""zoo.layers: interchangeable building blocks, registered by kind.

>>> from zoo import layers
>>> layers.list_layers('token_mixer')
>>> Mixer = layers.get('token_mixer', 'pooling')

See ``_registry`` for the kinds and their contracts. This package imports torch and einops only.
"""
from ._registry import KINDS, LayerRecord, get, layout_of, list_layers, name_of, record, records, register
from .drop import DropPath, LayerScale, drop_path, linear_drop_path_rates
from . import act, norm, mlp, token_mixers, embed, head  # noqa: F401  (register the blocks)
from . import raft, strip  # noqa: F401  (RaftMLP and Strip-MLP token mixers)
from . import weighted_conv, convbn  # noqa: F401  (conv blocks: weighted convolution, ConvBN modes)
from . import canon, sequence_mixers  # noqa: F401  (Canon layers and causal sequence mixers, issue 7)

__all__ = ['KINDS', 'LayerRecord', 'get', 'layout_of', 'list_layers', 'name_of', 'record', 'records', 'register',
           'DropPath', 'LayerScale', 'drop_path', 'linear_drop_path_rates']
from . import tnt  # noqa: F401  (TNT blocks, token_mixer/tnt)
from . import deform_attn, piip  # noqa: F401  (PIIP: pure-PyTorch deformable cross-attention and interaction units, issue 18)
from . import selective_scan, selective_scan_graph, mamba  # noqa: F401  (Mamba-YOLO's selective scan and SS2D blocks)
from . import detect  # noqa: F401  (YOLOv8-style neck and head blocks, issue 16)
from . import segment  # noqa: F401  (Semantic FPN and UperNet necks and heads, issue 28)
