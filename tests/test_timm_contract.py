"""timm's whole model contract on every classification family (issue 27, item 4), checked with timm's own helpers:
``forward_intermediates`` (indices, stop_early, intermediates_only, output_fmt) against ``FeatureHookNet`` hooks and
``FeatureGetterNet``, ``prune_intermediate_layers``, ``group_matcher`` through ``param_groups_layer_decay``,
``set_grad_checkpointing`` (the same gradients, really checkpointed) and ``get_classifier``; and (issue 44) timm's
own model tests (its ``tests/test_models.py``) restated with ``zoo.create``: forward, backward, default cfgs (std
and token features), ``features_only``, ``feature_cls``, ``forward_intermediates``, torch.fx forward and backward."""
from __future__ import annotations

import copy
import math

import pytest
import timm.data
import torch
from einops import rearrange
from timm.models import FeatureHookNet, group_parameters
from timm.optim import param_groups_layer_decay

import zoo
from zoo._timm_compat import feature_getter_net

FeatureGetterNet = feature_getter_net()

from conftest import example_input

CLS = [n for n in zoo.list_models(tiny=True) if zoo.model_info(n).task == 'classification']


def _model(name: str, **kw) -> torch.nn.Module:
    """The tiny variant in eval mode; PIIP's intermediates are its detection pyramid (``features_only``)."""
    torch.manual_seed(0)
    if zoo.model_info(name).family == 'piip':
        kw.setdefault('features_only', True)
    return zoo.create(name, **kw).eval()


def _reference_maps(model, x) -> list[torch.Tensor]:
    """Each stage's map taken independently of forward_intermediates: timm's FeatureHookNet hooks the
    ``feature_info`` modules of an unchanged copy and runs its ``forward`` (PIIP's pyramid: the same hooks by
    hand). TNT's blocks return (words, sentences)
    pairs, so its maps are made from a plain loop over the blocks."""
    if zoo.model_info(model.zoo_name).family == 'tnt':
        state, maps = model.forward_stem(x), []
        for blk in model.blocks:
            state = blk(*state)
            maps.append(rearrange(state[1][:, 1:], 'b (h w) d -> b d h w', h=model.word_embed.grid_size[0]))
        return maps
    if model.features_only:  # FeatureHookNet wants a model that returns a tensor: hook the modules ourselves
        maps, handles = [], [model.get_submodule(f['module']).register_forward_hook(lambda m, i, o: maps.append(o))
                             for f in model.feature_info]
        model(x)
        for h in handles:
            h.remove()
        return maps
    hooked = FeatureHookNet(copy.deepcopy(model), out_indices=tuple(range(model.num_stages)), no_rewrite=True)
    return hooked(x)


@pytest.mark.parametrize('name', CLS)
def test_forward_intermediates_follows_timm(name):
    model = _model(name)
    x = example_input(name, batch=1)
    n = model.num_stages
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        ref = _reference_maps(model, x)
        assert len(maps) == len(ref) == n == len(model.feature_info)
        for m, r, info in zip(maps, ref, model.feature_info):
            torch.testing.assert_close(m, r)
            assert m.shape[1] == info['num_chs'] and x.shape[-1] // m.shape[-1] == info['reduction']
        if not model.features_only:
            torch.testing.assert_close(final, model.forward_features(x))

        def take(**kw):
            return model.forward_intermediates(x, intermediates_only=True, **kw)

        for got, want in [(take(indices=2), maps[-2:]), (take(indices=[0, -1]), [maps[0], maps[-1]]),
                          (take(indices=[-2]), [maps[-2]])]:
            assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
        (nhwc,) = take(indices=[-1], output_fmt='NHWC')
        assert torch.equal(nhwc, maps[-1].permute(0, 2, 3, 1))
        (nlc,) = take(indices=[-1], output_fmt='NLC')
        assert torch.equal(nlc, maps[-1].flatten(2).transpose(1, 2))

        # stop_early: nothing after the last stage taken runs (a hook on the last stage's module stays silent)
        calls = []
        last = model.get_submodule(model.feature_info[-1]['module'])
        handle = last.register_forward_hook(lambda *a: calls.append(1))
        early_final, early = model.forward_intermediates(x, indices=[0], stop_early=True)
        handle.remove()
        assert not calls and len(early) == 1 and torch.equal(early[0], maps[0])
        if not model.features_only:
            assert torch.is_tensor(early_final)

        with pytest.raises(AssertionError, match='out of range'):  # timm's feature_take_indices
            take(indices=[n])
        with pytest.raises(ValueError, match='output_fmt'):
            take(output_fmt='NCL')


def test_tnt_norm_applies_the_final_norm_to_the_intermediates():
    model = _model('tnt_tiny')
    x = example_input('tnt_tiny')
    with torch.no_grad():
        state = model.forward_stem(x)
        state = model.blocks[0](*state)
        (normed,) = model.forward_intermediates(x, indices=[0], norm=True, intermediates_only=True)
    want = rearrange(model.norm(state[1])[:, 1:], 'b (h w) d -> b d h w', h=model.word_embed.grid_size[0])
    torch.testing.assert_close(normed, want)


@pytest.mark.parametrize('name', CLS)
def test_feature_getter_net_and_pruning_equal_features_only(name):
    """timm's FeatureGetterNet (which prunes the model first), a pruned copy and zoo's features_only model with the
    same weights give the same maps as the whole model's forward_intermediates."""
    full = _model(name)
    x = example_input(name, batch=1)
    wanted = (0, -2)
    with torch.no_grad():
        ref = full.forward_intermediates(x, indices=list(wanted), intermediates_only=True)
    absolute = sorted(i % full.num_stages for i in wanted)

    getter = FeatureGetterNet(copy.deepcopy(full), out_indices=wanted)
    assert [f['num_chs'] for f in getter.feature_info.get_dicts()] == [m.shape[1] for m in ref]

    pruned = copy.deepcopy(full)
    assert pruned.prune_intermediate_layers(list(wanted)) == absolute
    assert pruned.num_stages == absolute[-1] + 1
    if zoo.model_info(name).family != 'piip':  # PIIP's pyramid levels after stride 8 hold no parameters
        assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in full.parameters())

    feats = zoo.create(name, features_only=True, out_indices=wanted).eval()
    missing, _ = feats.load_state_dict(full.state_dict(), strict=False)
    assert not missing
    with torch.no_grad():
        outs = [getter(x), pruned.forward_intermediates(x, indices=absolute, intermediates_only=True), feats(x)]
    for out in outs:
        assert len(out) == len(ref) and all(torch.equal(a, b) for a, b in zip(out, ref))


def _first_use_order(model, x) -> list[str]:
    """Parameter names in the order a forward pass first uses their modules (the model's own parameters, e.g.
    PIIP's branch weights, are read somewhere inside its forward: left out)."""
    order, handles = [], []
    for mod_name, mod in model.named_modules():
        own = [f'{mod_name}.{p}' for p, _ in mod.named_parameters(recurse=False)]
        if own and mod_name:
            handles.append(mod.register_forward_pre_hook(lambda *a, own=own: order.extend(
                n for n in own if n not in order)))
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return order


@pytest.mark.parametrize('name', CLS)
@pytest.mark.parametrize('features_only', [False, True])
def test_group_matcher_drives_timm_layer_decay(name, features_only):
    model = _model(name, features_only=features_only, **({} if features_only else {'num_classes': 5}))
    groups = param_groups_layer_decay(model, weight_decay=0.05, layer_decay=0.5,
                                      no_weight_decay_list=model.no_weight_decay())
    ids = [id(p) for g in groups for p in g['params']]
    assert len(ids) == len(set(ids)) and set(ids) == {id(p) for p in model.parameters()}  # each exactly once

    layer = group_parameters(model, model.group_matcher(coarse=False), reverse=True)
    assert len(set(layer.values())) > model.num_stages if features_only else len(set(layer.values())) > 2
    stem = [n for n in layer if n.split('.')[0] in model.stem_names]
    assert all(layer[n] == 0 for n in stem)
    if not features_only:  # the classifier gets the full learning rate
        head = {id(p) for p in model.get_classifier().parameters()}
        assert all(g['lr_scale'] == 1.0 for g in groups for p in g['params'] if id(p) in head)
    # layer ids never decrease along the forward pass
    used = [layer[n] for n in _first_use_order(model, example_input(name, batch=1))]
    assert used == sorted(used), f'{name}: layer ids out of depth order'
    coarse = group_parameters(model, model.group_matcher(coarse=True), reverse=True)
    assert coarse.keys() == layer.keys() and len(set(coarse.values())) <= len(set(layer.values()))


CHECKPOINTED = [(n, {}) for n in CLS] + [('piip_tiny', {'features_only': True}), ('mamba_yolo_tiny', {})]


@pytest.mark.parametrize('name,kw', CHECKPOINTED, ids=[f'{n}{"-features" if k else ""}' for n, k in CHECKPOINTED])
def test_grad_checkpointing_gives_the_same_gradients(name, kw, monkeypatch):
    torch.manual_seed(0)
    plain = zoo.create(name, **kw).train()
    ckpt = copy.deepcopy(plain)
    ckpt.set_grad_checkpointing()
    x = example_input(name)
    if zoo.model_info(name).task == 'detection':
        x = x[..., :32, :32]  # a detector takes any multiple of 32: the smallest keeps the test fast

    def grads(model):
        torch.manual_seed(1)  # the same dropout / drop-path draws in both runs
        out = model(x)
        out = out if torch.is_tensor(out) else torch.cat([o.flatten() for o in out])
        out.square().mean().backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    calls = []
    real = torch.utils.checkpoint.checkpoint
    want = grads(plain)
    monkeypatch.setattr(torch.utils.checkpoint, 'checkpoint', lambda *a, **k: calls.append(1) or real(*a, **k))
    got = grads(ckpt)
    assert len(calls) >= 4, f'{name}: only {len(calls)} checkpointed calls'
    assert got.keys() == want.keys() and want
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f'{name} {n}: {m}')
    ckpt.eval()
    calls.clear()
    with torch.no_grad():
        ckpt(x)
    assert not calls  # inference is never checkpointed


@pytest.mark.parametrize('name', CLS)
def test_get_classifier_is_the_final_linear_layer(name):
    model = zoo.create(name, num_classes=5)
    head = model.get_classifier()
    linears = list(head) if isinstance(head, torch.nn.ModuleList) else [head]
    assert all(isinstance(h, torch.nn.Linear) and h.out_features == 5 for h in linears)
    assert [model.get_submodule(p) for p in zoo.classifier_prefix(model)] == linears
    assert _model(name, features_only=True).get_classifier() is None


def test_recipes_switch_gradient_checkpointing_on():
    """``--model.grad_checkpointing true``: the system turns timm's switch on (a detector passes it to its backbone);
    a model without it is a one-line error."""
    from zoo.recipes.detection import Detection
    assert zoo.recipes.ImageClassifier('poolformer_tiny', num_classes=3, grad_checkpointing=True).model.grad_checkpointing
    det = Detection('mamba_yolo_tiny', num_classes=3, grad_checkpointing=True)
    assert det.model.backbone.grad_checkpointing
    assert not zoo.recipes.ImageClassifier('poolformer_tiny', num_classes=3).model.grad_checkpointing
    with pytest.raises(ValueError, match='no set_grad_checkpointing'):
        zoo.recipes.CausalLM('llama_tiny', vocab_size=32, grad_checkpointing=True)


# ---- timm's own model tests (huggingface/pytorch-image-models tests/test_models.py), restated for zoo.create ------
# Every classification family's tiny variant runs them on the CPU; the smallest full-size variant of each family runs
# the configuration tests on the meta device (shapes only). timm's input-size rule and its size limits are kept:
# a model that declares a fixed input size is run at it, or skipped when that is above timm's limit.

FAMILIES = sorted({zoo.model_info(n).family for n in CLS})
SMALLEST_FULL = [min((n for n in zoo.list_models(family=f, tiny=False)), key=lambda n: zoo.model_info(n).params)
                 for f in FAMILIES]
# timm's NON_STD_FILTERS hold its ViT-like models (tnt_*, vit_*, ...): their forward_features gives tokens
TOKEN_FEATURES = ('tnt', 'piip')
# timm's EARLY_POOL_MODELS (timm's VGG among them): a head that pools before more layers has no unpooled output
EARLY_POOL = ('vgg11', 'vgg11_bn', 'vgg16', 'vgg16_bn')


def _family(name: str) -> str:
    return zoo.model_info(name).family


def _input_size(model, target: int | None = None) -> tuple:
    """timm's ``_get_input_size``: the cfg's size, the fixed one as it is, else ``min_input_size`` or the size
    clamped to ``target`` when it is larger."""
    cfg = model.default_cfg
    size = tuple(cfg['input_size'])
    if cfg.get('fixed_input_size'):
        return size
    if target and max(size) > target:
        return tuple(cfg['min_input_size']) if cfg.get('min_input_size') else tuple(min(s, target) for s in size)
    return size


def _randn(*shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize('name', CLS)
def test_timm_forward_and_grad_checkpointing(name):
    model = zoo.create(name).eval()
    x = _randn(1, *_input_size(model, target=384))  # every tiny variant is within timm's 384 px forward limit
    out = model(x)
    assert out.shape[0] == 1 and not torch.isnan(out).any()
    model.set_grad_checkpointing()
    torch.testing.assert_close(model(x), out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('name', CLS)
def test_timm_backward_every_parameter_gets_a_gradient(name):
    torch.manual_seed(0)
    model = zoo.create(name, num_classes=42).train()
    size = _input_size(model, target=128)
    out = model(_randn(2, *size))
    out.mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f'no gradient for {missing[:5]}'
    assert out.shape[-1] == 42 and not torch.isnan(out).any()
    assert sum(p.numel() for p in model.parameters()) == sum(p.grad.numel() for p in model.parameters())


def _std_cfg_checks(name, model, x):
    """timm's ``test_model_default_cfgs``: unpooled features of ``pool_size`` and ``num_features`` channels,
    pre-logits of ``head_hidden_size``, the same after ``reset_classifier(0)``; no pooling after
    ``reset_classifier(0, '')`` and from ``zoo.create(name, num_classes=0, global_pool='')``."""
    cfg = model.default_cfg
    feats = model.forward_features(x)
    pre = model.forward_head(feats, pre_logits=True)
    assert tuple(feats.shape[-2:]) == tuple(cfg['pool_size']), f'unpooled {tuple(feats.shape)} vs {cfg["pool_size"]}'
    assert feats.shape[1] == model.num_features
    assert pre.shape[1] == model.head_hidden_size
    model.reset_classifier(0)
    assert model.num_classes == 0
    out = model(x)
    assert out.ndim == 2 and out.shape == pre.shape and out.shape[1] == model.head_hidden_size
    if name in EARLY_POOL:
        with pytest.raises(ValueError, match='7x7 average-pooled'):
            model.reset_classifier(0, '')
        return
    model.reset_classifier(0, '')
    out = model(x)
    assert out.ndim == 4 and tuple(out.shape[-2:]) == tuple(cfg['pool_size'])
    with torch.device(x.device):
        fresh = zoo.create(name, num_classes=0, global_pool='').eval()
    out = fresh(x)
    assert out.ndim == 4 and tuple(out.shape[-2:]) == tuple(cfg['pool_size']) and out.shape[1] == model.num_features


def _token_cfg_checks(name, model, x):
    """timm's ``test_model_default_cfgs_non_std`` (token features: the last axis is the width; several tensors,
    as PIIP's branches, are not checked), then ``reset_classifier(0)`` and ``num_classes=0``."""
    feats = model.forward_features(x)
    pre = model.forward_head(feats, pre_logits=True)
    if torch.is_tensor(feats):
        assert feats.shape[-1 if feats.ndim == 3 else 1] == model.num_features
        assert pre.shape[1] == model.head_hidden_size
    model.reset_classifier(0)
    assert model.num_classes == 0
    out = model(x)
    assert out.shape[-1 if out.ndim == 3 else 1] == model.head_hidden_size and out.shape == pre.shape
    with torch.device(x.device):
        fresh = zoo.create(name, num_classes=0).eval()
    out = fresh(x)
    assert out.shape[-1 if out.ndim == 3 else 1] == model.num_features


def _cfg_names_checks(model):
    """The cfg's ``classifier`` and ``first_conv`` name weights of the model."""
    cfg, keys = model.default_cfg, model.state_dict().keys()
    assert model.num_classes >= 0 and model.num_features > 0 and model.head_hidden_size > 0
    if cfg.get('num_classes'):
        for c in (cfg['classifier'],) if isinstance(cfg['classifier'], str) else cfg['classifier']:
            assert c + '.weight' in keys, f'classifier {c} not in the state dict'
    first = cfg['first_conv']
    assert isinstance(first, (str, tuple, list))
    for c in (first,) if isinstance(first, str) else first:
        assert c + '.weight' in keys, f'first_conv {c} not in the state dict'


@pytest.mark.parametrize('name,device', [(n, 'cpu') for n in CLS] + [(n, 'meta') for n in SMALLEST_FULL])
def test_timm_default_cfgs(name, device):
    with torch.device(device), torch.no_grad():
        model = zoo.create(name).eval()
        _cfg_names_checks(model)
        if _family(name) in TOKEN_FEATURES:
            size = _input_size(model)
            if max(size) > 320:
                pytest.skip('fixed input size above timm\'s limit for token models')
            _token_cfg_checks(name, model, torch.randn(1, *size))
        else:
            size = tuple(model.default_cfg['input_size'])
            assert max(size) <= 448  # timm checks shapes up to 448
            _std_cfg_checks(name, model, torch.randn(1, *size))


def test_vgg_num_features_are_the_feature_channels_and_head_hidden_size_the_mlp():
    with torch.device('meta'):
        m = zoo.create('vgg11')
    assert (m.num_features, m.head_hidden_size, m.fc.in_features) == (512, 4096, 4096)
    m.reset_classifier(10)
    assert m.fc.in_features == 4096
    assert zoo.create('vgg_tiny').head_hidden_size == zoo.create('vgg_tiny').num_features == 64


@pytest.mark.parametrize('name', [n for n in CLS if _family(n) != 'tnt'])  # timm leaves its tnt_* out (NON_STD)
def test_timm_forward_features(name):
    model = zoo.create(name, features_only=True).eval()
    channels, reductions = model.feature_info.channels(), model.feature_info.reduction()
    assert len(channels) >= 3 and len(model.feature_info.module_name()) == len(channels)
    size = _input_size(model, target=96)
    with torch.no_grad():
        outs = model(_randn(1, *size))
    _check_levels(outs, channels, reductions, size)


def _check_levels(outs, channels, reductions, size):
    assert len(outs) == len(channels)
    for c, r, o in zip(channels, reductions, outs):
        assert o.shape[0] == 1 and o.shape[1] == c and not torch.isnan(o).any()
        assert o.shape[2] <= math.ceil(size[1] / r) + 1 and o.shape[3] <= math.ceil(size[2] / r) + 1


@pytest.mark.parametrize('name', CLS)
def test_timm_forward_intermediates_features_getter(name):
    model = zoo.create(name, features_only=True, feature_cls='getter').eval()
    size = _input_size(model, target=96)
    with torch.no_grad():
        outs = model(_randn(1, *size))
    _check_levels(outs, model.feature_info.channels(), model.feature_info.reduction(), size)


@pytest.mark.parametrize('name', CLS)
def test_timm_forward_intermediates(name):
    from timm.models import FeatureInfo
    model = zoo.create(name).eval()
    info = FeatureInfo(model.feature_info, len(model.feature_info))
    # timm's models here have >= 3 levels; piip_tiny's classifier has 2 (its two interaction stages)
    assert len(info.channels()) >= min(3, model.num_stages)
    size = _input_size(model, target=96)
    x = _randn(1, *size)
    with torch.no_grad():
        final, inter = model.forward_intermediates(x, output_fmt='NCHW')
        _check_levels(inter, info.channels(), info.reduction(), size)
        ref = model.forward_features(x)
        model.set_grad_checkpointing()
        again, _ = model.forward_intermediates(x, output_fmt='NCHW')
    for a, b, c in zip(*(f if isinstance(f, list) else [f] for f in (final, ref, again))):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(c, a, rtol=1e-4, atol=1e-5)


# torch.fx: input checks and the oneDNN door step aside for the tracer; einops calls are traced as single calls.
# RaftMLP (token grids resized to the built grid by Python branches on the input's size) and PIIP (branch images
# resized by the input's size) are not traceable yet.
FX_TODO = ('raftmlp', 'piip')
FX = [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason='not FX-traceable yet'))
      if _family(n) in FX_TODO else n for n in CLS]


def _fx_model(model, train: bool = False):
    """timm's ``_create_fx_model``: torchvision's feature extractor over timm's no-trace lists, returning the
    node(s) that feed the graph's output."""
    from timm.models import get_notrace_functions, get_notrace_modules
    from torchvision.models.feature_extraction import NodePathTracer, create_feature_extractor, get_graph_node_names

    kw = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(),
              param_shapes_constant=True)
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=kw)
    train_return = [train_nodes[-1]]
    if train:
        graph = NodePathTracer(**kw).trace(model)
        nodes = list(reversed(graph.nodes))
        names = [n.name for n in nodes]
        train_return = [train_nodes[-names.index(n.name)] for n in nodes[0]._input_nodes]
    return create_feature_extractor(model, train_return_nodes=train_return, eval_return_nodes=[eval_nodes[-1]],
                                    tracer_kwargs=kw)


@pytest.mark.parametrize('name', FX)
def test_timm_forward_fx(name):
    model = zoo.create(name).eval()
    x = _randn(1, *_input_size(model, target=128))
    with torch.inference_mode():
        out = model(x)
        fx_out = torch.cat(tuple(_fx_model(model)(x).values()))
    # timm asks for equality; here the eager model's CPU-inference paths (oneDNN kernels, GRN's per-sample norm)
    # compute the same function as the plain ops the graph records, rounded differently
    torch.testing.assert_close(fx_out, out)
    assert not torch.isnan(out).any()


@pytest.mark.parametrize('name', FX)
def test_timm_backward_fx(name):
    torch.manual_seed(0)
    model = zoo.create(name, num_classes=42).train()
    n_params = sum(p.numel() for p in model.parameters())
    fx = _fx_model(model, train=True)
    out = torch.cat(tuple(fx(_randn(2, *_input_size(model, target=128))).values()))
    out.mean().backward()
    assert all(p.grad is not None for p in fx.parameters())
    assert out.shape[-1] == 42 and sum(p.grad.numel() for p in fx.parameters()) == n_params


MAP_FX = [n for n in CLS if _family(n) not in FX_TODO + TOKEN_FEATURES]  # stage modules that output maps


@pytest.mark.parametrize('name', MAP_FX)
def test_torchvision_feature_extractor_gives_the_stage_maps(name):
    """torchvision's ``create_feature_extractor`` with its own tracer (no timm lists) on the ``feature_info``
    modules gives the maps ``forward_intermediates`` gives."""
    from torchvision.models.feature_extraction import create_feature_extractor
    model = zoo.create(name).eval()
    x = example_input(name, batch=1)
    nodes = {f['module']: str(i) for i, f in enumerate(model.feature_info)}
    with torch.no_grad():
        got = create_feature_extractor(model, return_nodes=nodes)(x)
        want = model.forward_intermediates(x, intermediates_only=True)
    assert len(got) == len(want)
    for i, w in enumerate(want):
        torch.testing.assert_close(got[str(i)], w)


# ---- the new arguments and their errors (the private names they rest on: tests/test_private_surface.py) --------------

def test_new_arguments_fail_with_one_line_errors():
    cases = [(dict(feature_cls='getter'), 'pass features_only=True'),
             (dict(features_only=True, feature_cls='fx'), "feature_cls must be 'getter'"),
             (dict(global_pool='max'), "global_pool must be one of 'avg', ''"),
             (dict(global_pool=''), 'needs num_classes=0')]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg) as e:
            zoo.create('resnet_tiny', **kw)
        assert '\n' not in str(e.value)
    with pytest.raises(ValueError, match="feature_cls='getter' gives the maps"):
        zoo.create('tnt_tiny', features_only=True, feature_cls='hook')
    with pytest.raises(ValueError, match='needs num_classes=0'):
        zoo.create('resnet_tiny').reset_classifier(3, '')
    with torch.device('meta'), pytest.raises(ValueError, match="stem='imagenet'"):
        zoo.create('vgg11', num_classes=0, global_pool='')
    assert 'global_pool' in str(pytest.raises(TypeError, zoo.create, 'resnet_tiny', global_pol='').value)


@pytest.mark.parametrize('name', CLS)
def test_reset_classifier_with_each_global_pool(name):
    model = zoo.create(name).eval()
    x = example_input(name, batch=1)
    with torch.no_grad():
        feats = model.forward_features(x)
        for pool in model.pool_types:
            model.reset_classifier(0, pool)
            out = model(x)
            if pool == '':
                assert all(torch.equal(a, b) for a, b in zip(*(o if isinstance(o, list) else [o] for o in (out, feats))))
                continue
            assert out.shape == (1, model.head_hidden_size)
            model.reset_classifier(5, pool)
            assert model(x).shape == (1, 5) and model.global_pool == pool


def test_tnt_avg_pool_is_the_mean_of_the_patch_tokens():
    model = zoo.create('tnt_tiny', num_classes=0, global_pool='avg').eval()
    x = example_input('tnt_tiny', batch=1)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.forward_features(x)[:, 1:].mean(1))


@pytest.mark.parametrize('name', CLS)
def test_timm_resolves_the_input_the_model_declares(name):
    for kw in ({}, {'features_only': True}):
        model = zoo.create(name, **kw)
        cfg = timm.data.resolve_data_config(model=model)
        assert cfg['input_size'] == model.pretrained_cfg['input_size']
        assert model.pretrained_cfg['fixed_input_size'] == (_family(name) in ('tnt', 'stripmlp')
                                                            or (_family(name) == 'piip' and not kw))


def test_piip_min_input_size_is_the_smallest_input_its_branches_take():
    det = zoo.create('piip_tiny', features_only=True).eval()
    c, s, _ = det.pretrained_cfg['min_input_size']
    assert (c, s) == (3, 64)
    with torch.no_grad():
        assert len(det(torch.randn(1, 3, s, s))) == 4
    with pytest.raises(ValueError):
        det(torch.randn(1, 3, s - 16, s - 16))
    with torch.device('meta'):
        tsb = zoo.create('piip_tsb', features_only=True)
    assert tsb.pretrained_cfg['min_input_size'] == (3, 80, 80) and tsb.pretrained_cfg['input_size'] == (3, 1120, 1120)
    assert zoo.create('piip_tiny').pretrained_cfg['min_input_size'] == (3, 64, 64)  # the classifier: its one size


def test_piip_classifier_intermediates_are_the_last_branch_maps_and_timm_wraps_them():
    full = zoo.create('piip_tiny').eval()
    x = example_input('piip_tiny', batch=1)
    taps = []
    with torch.no_grad():
        _, _, grids = full.forward_branches(x, taps=taps)
        final, maps = full.forward_intermediates(x)
        normed = full.forward_intermediates(x, indices=[0], norm=True, intermediates_only=True)
        early = full.forward_intermediates(x, indices=[0], stop_early=True, intermediates_only=True)
        getter = FeatureGetterNet(copy.deepcopy(full), out_indices=(0,))
        pruned = getter(x)
    h, w = grids[-1]
    want = [rearrange(t, 'b (h w) d -> b d h w', h=h, w=w) for t in taps]
    assert len(maps) == full.num_stages == len(full.feature_info) == 2
    assert all(torch.equal(a, b) for a, b in zip(maps, want))
    assert all(torch.equal(a, b) for a, b in zip(final, full.forward_features(x)))
    last = full.branches[-1]
    torch.testing.assert_close(normed[0], rearrange(last.norm(taps[0]), 'b (h w) d -> b d h w', h=h, w=w))
    assert torch.equal(early[0], maps[0]) and torch.equal(pruned[0], maps[0])
    assert len(getter.model.interactions) == 1 and len(getter.model.branch1.blocks) == 1


@pytest.mark.parametrize('name', [n for n in CLS if _family(n) not in TOKEN_FEATURES])
def test_feature_cls_hook_and_getter_give_the_maps_of_forward_intermediates(name):
    torch.manual_seed(0)
    full = zoo.create(name).eval()
    x = example_input(name, batch=1)
    with torch.no_grad():
        want = full.forward_intermediates(x, indices=[0, -1], intermediates_only=True)
    for cls in ('hook', 'getter'):
        wrapped = zoo.create(name, features_only=True, feature_cls=cls, out_indices=(0, -1)).eval()
        missing, _ = wrapped.load_state_dict({f'{"body" if cls == "hook" else "model"}.{k}': v
                                              for k, v in full.state_dict().items()}, strict=False)
        assert not missing
        assert wrapped.feature_info.channels() == [m.shape[1] for m in want]
        assert wrapped.pretrained_cfg['architecture'] == name
        with torch.no_grad():
            got = wrapped(x)
        assert len(got) == 2 and all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize('name', CLS)
def test_features_only_models_carry_timm_feature_info(name):
    from timm.models import FeatureInfo
    model = zoo.create(name, features_only=True)
    info = model.feature_info
    assert isinstance(info, FeatureInfo)
    assert info.channels() == [f['num_chs'] for f in info] == [f.num_chs for f in info[:]]
    assert info.reduction() == [f['reduction'] for f in info]
    assert all(isinstance(model.get_submodule(m), torch.nn.Module) for m in info.module_name())
