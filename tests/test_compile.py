"""torch.compile sees plain PyTorch: every family here compiles without graph breaks and matches eager.

The oneDNN fast path (zoo.layers.onednn) must be invisible to dynamo and inductor (issue 26): under
``torch.compile`` its helpers run plain aten ops, so inductor can fuse them and, with ``freezing``, fold and
pack the weights itself (a private ``torch.ops.mkldnn`` call with a weight as a graph input made inductor fail
with "weight must be a graph constant"). Families owned elsewhere (sequence models, PIIP, Mamba-YOLO,
detectors) are tested with their exporters.

Compile time dominates: tiny variants at their 32 px (16 px for DnCNN), batch 2; the deepest variants with one
block per stage for the inductor cases (the graph-break check runs dynamo alone, on the registered variant).
"""
from __future__ import annotations

import pytest
import torch

import zoo

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')  # inductor's notes about the CPU it compiles for

# name -> the kwargs that shorten it for inductor (same blocks, fewer of them)
_MODELS = {
    'poolformer_tiny': {},
    'metaformer_tiny': {'token_mixer': ('raft', 'strip', 'tnt', 'pooling')},  # the oneDNN mixers, one per stage
    'tnt_tiny': {'depth': 2},
    'raftmlp_tiny': {'depths': (1, 1, 1, 1)},
    'stripmlp_tiny': {'depths': (1, 1, 1, 1)},
    'resnet_tiny': {},
    'vgg_tiny': {},
    'dncnn_tiny': {},
}


def _build(name: str, short: bool = False) -> tuple[torch.nn.Module, torch.Tensor]:
    info = zoo.model_info(name)
    kwargs = dict(_MODELS[name]) if short else {k: v for k, v in _MODELS[name].items() if k == 'token_mixer'}
    if info.task == 'classification':
        kwargs['num_classes'] = 5
    torch.manual_seed(0)
    model = zoo.create(name, **kwargs).eval()
    return model, torch.randn(2, *info.input_size)


def _no_mkldnn(graphs) -> list[str]:
    return [str(n.target) for g in graphs for n in g.graph.nodes if 'mkldnn' in str(n.target)]


@pytest.mark.parametrize('grad', [False, True], ids=['no_grad', 'grad'])
@pytest.mark.parametrize('name', list(_MODELS))
def test_dynamo_captures_one_graph_of_plain_ops(name, grad):
    """``torch._dynamo.explain``: no graph break, and no private oneDNN op in the graph (plain aten ops only)."""
    torch._dynamo.reset()
    model, x = _build(name)
    with torch.set_grad_enabled(grad):
        explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0, [str(r.reason)[:300] for r in explained.break_reasons]
    assert explained.graph_count == 1
    assert not _no_mkldnn(explained.graphs)
    torch._dynamo.reset()


@pytest.mark.parametrize('name', list(_MODELS))
def test_compiled_model_matches_eager(name):
    torch._dynamo.reset()
    model, x = _build(name, short=True)
    with torch.no_grad():
        eager = model(x)  # the oneDNN fast path where it applies
        compiled = torch.compile(model)(x)
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()


def test_freezing_compile_of_a_onednn_family_matches_eager():
    """Inductor's freezing (weights as constants, packed for oneDNN by inductor itself) on TNT, whose eager
    inference runs every Linear through zoo.layers.onednn: it used to fail with "weight must be a graph constant"."""
    from torch._inductor import config

    torch._dynamo.reset()
    model, x = _build('tnt_tiny', short=True)
    with torch.no_grad(), config.patch(freezing=True):
        eager = model(x)
        compiled = torch.compile(model)(x)
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()
