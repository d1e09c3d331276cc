"""timm's whole model contract on every classification family (issue 27, item 4), checked with timm's own helpers:
``forward_intermediates`` (indices, stop_early, intermediates_only, output_fmt) against ``FeatureHookNet`` hooks and
``FeatureGetterNet``, ``prune_intermediate_layers``, ``group_matcher`` through ``param_groups_layer_decay``,
``set_grad_checkpointing`` (the same gradients, really checkpointed) and ``get_classifier``."""
from __future__ import annotations

import copy

import pytest
import torch
from einops import rearrange
from timm.models import group_parameters
from timm.models._features import FeatureGetterNet, FeatureHookNet
from timm.optim import param_groups_layer_decay

import zoo

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
