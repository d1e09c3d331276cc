"""torch.compile sees plain PyTorch: every family here compiles without graph breaks and matches eager.

The oneDNN fast path (zoo.layers.onednn) must be invisible to dynamo and inductor (issue 26): under
``torch.compile`` its helpers run plain aten ops, so inductor can fuse them and, with ``freezing``, fold and
pack the weights itself (a private ``torch.ops.mkldnn`` call with a weight as a graph input made inductor fail
with "weight must be a graph constant"). Families owned elsewhere (sequence models, Mamba-YOLO,
detectors) are tested with their exporters.

Compile time dominates: tiny variants at their 32 px (16 px for DnCNN), batch 2, the deeper ones shortened to one
block per stage (same blocks, fewer of them).
"""
from __future__ import annotations

import pytest
import torch

import zoo

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')  # inductor's notes about the CPU it compiles for

# (name, kwargs that shorten it: same blocks, fewer of them; tnt keeps a full block before the last)
_MODELS = {
    'poolformer_tiny': ('poolformer_tiny', {}),
    'metaformer_tiny-onednn_mixers': ('metaformer_tiny', {'token_mixer': ('raft', 'strip', 'tnt', 'pooling'),
                                                          'depths': (1, 1, 1, 1)}),
    'metaformer_tiny-other_mixers': ('metaformer_tiny', {'token_mixer': ('sepconv', 'attention', 'identity', 'pooling'),
                                                         'depths': (1, 1, 1, 1)}),
    'tnt_tiny': ('tnt_tiny', {'depth': 2}),
    'raftmlp_tiny': ('raftmlp_tiny', {'depths': (1, 1, 1, 1)}),
    'stripmlp_tiny': ('stripmlp_tiny', {'depths': (1, 1, 1, 1)}),
    'resnet_tiny': ('resnet_tiny', {}),
    'vgg_tiny': ('vgg_tiny', {}),
    'dncnn_tiny': ('dncnn_tiny', {}),
    'piip_tiny': ('piip_tiny', {'num_interactions': 1, 'depths': (1, 1, 1)}),  # sampling: torch.ops.zoo.grid_sample
}


def _build(case: str) -> tuple[torch.nn.Module, torch.Tensor]:
    name, kwargs = _MODELS[case]
    info = zoo.model_info(name)
    kwargs = dict(kwargs)
    if info.task == 'classification':
        kwargs['num_classes'] = 5
    torch.manual_seed(0)
    model = zoo.create(name, **kwargs).eval()
    return model, torch.randn(2, *info.input_size)


def _mkldnn_nodes(graphs) -> list[str]:
    return [str(n.target) for g in graphs for n in g.graph.nodes if 'mkldnn' in str(n.target)]


@pytest.mark.parametrize('name', list(_MODELS))
def test_compiled_model_has_no_graph_break_and_matches_eager(name):
    """``torch._dynamo.explain`` with a dynamic batch: one graph, no private oneDNN op in it (plain aten ops
    only); then inductor's output equals eager's (the oneDNN fast path where it applies)."""
    torch._dynamo.reset()
    model, x = _build(name)
    xd = x.clone()
    torch._dynamo.mark_dynamic(xd, 0)  # a batch of any size: no Python loop over it, no specialisation
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(xd)
        assert explained.graph_break_count == 0, [str(r.reason)[:300] for r in explained.break_reasons]
        assert explained.graph_count == 1
        assert not _mkldnn_nodes(explained.graphs)
        torch._dynamo.reset()
        eager = model(x)
        compiled = torch.compile(model)(x)
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()


@pytest.mark.parametrize('name', ['poolformer_tiny', 'tnt_tiny', 'raftmlp_tiny', 'stripmlp_tiny'])
def test_dynamo_sees_plain_ops_with_autograd_too(name):
    """With autograd the helpers would run oneDNN's GEMM as an autograd.Function (``_Linear``): not under dynamo."""
    torch._dynamo.reset()
    model, x = _build(name)
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0, [str(r.reason)[:300] for r in explained.break_reasons]
    assert not _mkldnn_nodes(explained.graphs)
    torch._dynamo.reset()


def test_freezing_compile_of_a_onednn_family_matches_eager():
    """Inductor's freezing (weights as constants, packed for oneDNN by inductor itself) on TNT, whose eager
    inference runs every Linear through zoo.layers.onednn: it used to fail with "weight must be a graph constant"."""
    from torch._inductor import config

    torch._dynamo.reset()
    model, x = _build('tnt_tiny')
    with torch.no_grad(), config.patch(freezing=True):
        eager = model(x)
        compiled = torch.compile(model)(x)
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-4)
    torch._dynamo.reset()


def test_mamba_yolo_captures_the_scan_as_one_operator():
    """Mamba-YOLO in eval: dynamo sees one graph (no break) in which every selective scan is one
    ``zoo::selective_scan`` node (the eager chunked scan, opaque: no unrolled loop, no log-depth rewrite);
    an SS2D block compiled with inductor's freezing equals eager."""
    from torch._inductor import config
    from zoo.layers.mamba import SS2D

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = zoo.create('mamba_yolo_tiny').eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        explained = torch._dynamo.explain(model.forward_raw)(x)
    assert explained.graph_break_count == 0, [str(r.reason)[:300] for r in explained.break_reasons]
    scans = [n for g in explained.graphs for n in g.graph.nodes if n.target is torch.ops.zoo.selective_scan]
    assert len(scans) == sum(isinstance(m, SS2D) for m in model.modules()) > 0
    torch._dynamo.reset()
    block, xb = SS2D(16, d_state=4).eval(), torch.randn(2, 16, 9, 7)
    with torch.no_grad(), config.patch(freezing=True):
        eager = block(xb)
        compiled = torch.compile(block)(xb)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()
