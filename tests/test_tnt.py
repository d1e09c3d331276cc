"""TNT (Transformer in Transformer): exact counts, equality with timm's tnt_s_patch16_224, the key
mappings (timm and official layouts), dense features, and the TNT pair as a MetaFormer token mixer."""
from __future__ import annotations

import pytest
import torch

import zoo
from zoo.layers.tnt import TNTMixer
from zoo.tnt import TNT, TNTBlock

timm = pytest.importorskip('timm')
from timm.models import tnt as timm_tnt  # noqa: E402

# The tiny config in timm's own TNT class, to compare whole forward passes cheaply.
TINY_TIMM = dict(img_size=32, patch_size=8, first_stride=2, embed_dim=96, inner_dim=12, depth=4,
                 num_heads_outer=3, num_heads_inner=2, num_classes=10)


def _perturb(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random non-trivial weights (zero biases and unit norms would hide mapping mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def _official_from_timm(sd: dict, d: int, n: int) -> dict:
    """timm layout -> the official tnt_pytorch layout (the inverse of timm's checkpoint_filter_fn),
    with the official frozen ``outer_tokens``."""
    names = [('pixel_embed', 'patch_embed'), ('pixel_pos', 'inner_pos'), ('patch_pos', 'outer_pos'),
             ('norm1_proj', 'proj_norm1'), ('norm2_proj', 'proj_norm2'), ('norm_mlp_in', 'inner_norm2'),
             ('norm_in', 'inner_norm1'), ('attn_in', 'inner_attn'), ('mlp_in', 'inner_mlp'),
             ('norm_out', 'outer_norm1'), ('attn_out', 'outer_attn'), ('norm_mlp', 'outer_norm2'),
             ('.mlp.', '.outer_mlp.')]
    out = {}
    for k, v in sd.items():
        for a, b in names:
            k = k.replace(a, b)
        if k == 'inner_pos':
            v = v.flatten(2).transpose(1, 2)  # (1, c, a, b) -> (1, a*b, c)
        out[k] = v
    out['outer_tokens'] = torch.zeros(1, n, d)
    return out


@pytest.mark.parametrize('name,trainable,frozen', [('tnt_s', 23_768_584, 75_264), ('tnt_b', 65_428_680, 125_440)])
def test_full_size_counts_and_official_readme(name, trainable, frozen):
    with torch.device('meta'):
        model = zoo.create(name)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == trainable
    assert sum(p.numel() for p in model.parameters()) == trainable  # no dead outer_tokens parameter
    # the official README counts the unused, frozen outer_tokens (196 x d): 65.6M for TNT-B
    d = model.num_features
    assert frozen == 196 * d and round((trainable + frozen) / 1e6, 1) == {'tnt_s': 23.8, 'tnt_b': 65.6}[name]


def test_per_block_parameter_formula_at_small_width():
    c, d = 8, 32
    block = TNTBlock(c, d, num_words=16, inner_heads=2, outer_heads=2)
    assert sum(p.numel() for p in block.parameters()) == 12 * c * c + 42 * c + 16 * c * d + 12 * d * d + 12 * d


def test_tnt_s_equals_timm_through_a_saved_checkpoint(tmp_path):
    torch.manual_seed(0)
    ref = _perturb(timm.create_model('tnt_s_patch16_224'))
    path = tmp_path / 'tnt_s_patch16_224.pth'
    torch.save(ref.state_dict(), path)
    ours = zoo.create('tnt_s', checkpoint=path).eval()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (ours(x) - ref(x)).abs().max().item()
    assert diff < 1e-4, diff


def test_tiny_config_equals_timm_tnt_class_in_train_and_eval_features():
    torch.manual_seed(0)
    ref = _perturb(timm_tnt.TNT(**TINY_TIMM))
    ours = zoo.create('tnt_tiny', num_classes=10).eval()
    ours.load_state_dict(TNT.remap_checkpoint(ref.state_dict()))
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)


def test_key_mapping_round_trip_and_official_layout():
    torch.manual_seed(0)
    ref = _perturb(timm_tnt.TNT(**TINY_TIMM))
    sd = ref.state_dict()
    ours_sd = TNT.remap_checkpoint(sd)
    # ours -> timm -> ours is the identity, key for key and value for value
    back = TNT.to_timm(ours_sd)
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)
    assert all(torch.equal(TNT.remap_checkpoint(back)[k], v) for k, v in ours_sd.items())
    assert TNT.remap_checkpoint(ours_sd).keys() == ours_sd.keys()
    # the official layout: timm's own filter and ours must agree on it
    official = _official_from_timm(sd, d=96, n=16)
    assert 'outer_tokens' in official
    ref2 = timm_tnt.TNT(**TINY_TIMM).eval()
    ref2.load_state_dict(timm_tnt.checkpoint_filter_fn(dict(official), ref2))
    ours = zoo.create('tnt_tiny', num_classes=10).eval()
    ours.load_state_dict(TNT.remap_checkpoint(official))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ref2(x), ref(x), atol=0, rtol=0)


def test_legacy_and_foreign_state_dicts_are_refused():
    with torch.device('meta'):
        legacy = timm.create_model('tnt_s_legacy_patch16_224')
    with pytest.raises(KeyError, match='legacy'):
        TNT.remap_checkpoint(legacy.state_dict())
    with pytest.raises(KeyError, match='not a TNT state dict'):
        TNT.remap_checkpoint({'conv.weight': torch.zeros(1)})


def test_fixed_input_size_error_names_the_size():
    model = zoo.create('tnt_tiny').eval()
    with pytest.raises(ValueError, match='built for 32x32'):
        model(torch.randn(1, 3, 40, 40))


def test_shapes_and_class_token_gets_no_word_contribution():
    torch.manual_seed(0)
    model = zoo.create('tnt_tiny').eval()
    block = model.blocks[0]
    words, sentences = torch.randn(2 * 16, 16, 12), torch.randn(2, 17, 96)
    # silence the outer transformer: what is left is the word-to-sentence fuse
    with torch.no_grad():
        for lin in (block.outer_attn.proj, block.outer_mlp.fc2):
            lin.weight.zero_()
            lin.bias.zero_()
        w, s = block(words, sentences)
        _, s2 = block(words * 3 + 1, sentences)
    assert w.shape == (32, 16, 12) and s.shape == (2, 17, 96)
    assert torch.equal(s[:, 0], sentences[:, 0]) and torch.equal(s2[:, 0], sentences[:, 0])
    assert not torch.allclose(s[:, 1:], s2[:, 1:])


def test_features_only_single_scale_map():
    torch.manual_seed(0)
    model = zoo.create('tnt_tiny', features_only=True).eval()
    assert [(f.num_chs, f.reduction) for f in model.feature_info] == [(96, 8)]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        (fmap,) = model(x)
    assert fmap.shape == (2, 96, 4, 4)
    full = zoo.create('tnt_tiny').eval()
    missing, unexpected = full.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and {k.split('.')[0] for k in missing} == {'norm', 'head'}
    with torch.no_grad():  # the map is the last block's sentence tokens, before the final norm
        state = full.forward_stem(x)
        for blk in full.blocks:
            state = blk(*state)
        tokens = state[1][:, 1:]
    torch.testing.assert_close(fmap.flatten(2).transpose(1, 2), tokens)


def test_mixer_is_local_inside_sentences_without_the_outer_path():
    torch.manual_seed(0)
    mixer = TNTMixer(16, sentence_size=2).eval()
    with torch.no_grad():
        mixer.outer_attn.proj.weight.zero_()
        mixer.outer_attn.proj.bias.zero_()
        x = torch.randn(1, 16, 4, 4)
        y = x.clone()
        y[..., 0, 0] += 1.0  # change a word of the top-left sentence only
        a, b = mixer(x), mixer(y)
    assert not torch.allclose(a[..., :2, :2], b[..., :2, :2])
    torch.testing.assert_close(a[..., 2:, :], b[..., 2:, :], atol=0, rtol=0)
    torch.testing.assert_close(a[..., :, 2:], b[..., :, 2:], atol=0, rtol=0)


def test_mixer_on_a_grid_that_needs_padding():
    torch.manual_seed(0)
    mixer = TNTMixer(16, sentence_size=4).eval()
    x = torch.randn(2, 16, 5, 3)
    with torch.no_grad():
        y = mixer(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    # A 1x1 grid is one valid word among 15 padded ones: with the padded keys masked the word attends to
    # itself only (softmax over one key), so with the outer path silenced the mixer is proj(v(x)).
    with torch.no_grad():
        mixer.outer_attn.proj.weight.zero_()
        mixer.outer_attn.proj.bias.zero_()
        x = torch.randn(3, 16, 1, 1)
        v = torch.nn.functional.linear(x.flatten(1), mixer.inner_attn.qkv.weight[32:])
        expected = mixer.inner_attn.proj(v)
        torch.testing.assert_close(mixer(x).flatten(1), expected, atol=1e-5, rtol=1e-5)


def test_metaformer_with_tnt_mixer_trains():
    torch.manual_seed(0)
    model = zoo.create('metaformer_tiny', token_mixer='tnt', num_classes=4).train()
    assert isinstance(model.stages[0].blocks[0].token_mixer, TNTMixer)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    x, y = torch.randn(8, 3, 32, 32), torch.arange(8) % 4
    losses = []
    for _ in range(8):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.7, losses


def test_metaformer_s12_with_tnt_mixer_builds_at_224():
    with torch.device('meta'):
        model = zoo.create('metaformer_s12', token_mixer='tnt')
        out = model(torch.zeros(1, 3, 224, 224))
    assert out.shape == (1, 1000)


# ---- the faster inference path computes the same function ------------------------------------------

def test_word_stream_is_contiguous_words_by_channels():
    # the conv's channels-first output is laid out as (B*N, m, c) once, so no block copies the words
    model = zoo.create('tnt_tiny', num_classes=10).eval()
    words = model.word_embed(torch.randn(2, 3, 32, 32))
    assert words.shape == (2 * 16, 16, 12) and words.is_contiguous()


def test_in_place_inference_path_equals_the_autograd_path_and_leaves_inputs_alone():
    model = _perturb(zoo.create('tnt_tiny', num_classes=10))
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with_grad = model.forward_features(x)                  # eval, autograd on: the out-of-place path
    with torch.inference_mode():
        fast = model.forward_features(x)                   # eval, no autograd: in place, oneDNN linears
    # oneDNN's GEMMs round differently from MKL's: equal within 1e-5 of the largest output (issue 19's criterion)
    torch.testing.assert_close(fast, with_grad.detach(), rtol=0, atol=1e-5 * with_grad.abs().max().item())
    blk = model.blocks[0]
    words, sentences = torch.randn(3 * 16, 16, 12), torch.randn(3, 17, 96)
    w0, s0 = words.clone(), sentences.clone()
    with torch.no_grad():
        blk(words, sentences)
        blk.forward_class_token(words, sentences)
    assert torch.equal(words, w0) and torch.equal(sentences, s0)


def test_inference_logits_from_the_class_token_only_last_block_equal_the_full_forward():
    torch.manual_seed(0)
    model = _perturb(zoo.create('tnt_tiny', num_classes=10))
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    seen = []
    hook = model.blocks[-1].outer_norm2.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))  # MLP input
    with_grad = model(x)                                       # autograd: all 1+N tokens through the last block
    with torch.inference_mode():
        full = model.forward_head(model.forward_features(x))   # every token, no autograd
        fast = model(x)                                        # the class token alone in the last block
    hook.remove()
    assert seen == [17, 17, 1]
    torch.testing.assert_close(fast, full, rtol=0, atol=1e-5)
    torch.testing.assert_close(fast, with_grad.detach(), rtol=0, atol=1e-5)


def test_attention_for_the_first_queries_equals_the_first_rows():
    from zoo.layers.tnt import TokenAttention
    torch.manual_seed(0)
    attn = TokenAttention(32, 4, qkv_bias=True).eval()
    x = torch.randn(2, 9, 32)
    torch.testing.assert_close(attn(x, num_queries=2), attn(x)[:, :2], rtol=0, atol=1e-6)


def test_mlp_table_pairs_tnt_with_the_poolformer_of_similar_macs(one_thread):
    from benchmarks import bench_mlp
    rows = bench_mlp.run(['tnt_s'], batch_sizes=(1,), repeats=1, warmup=0)
    by_model = {r['model']: r for r in rows}
    assert set(by_model) == {'tnt_s', 'poolformer_s36'}
    tnt = by_model['tnt_s']
    assert tnt['vs'] == 'poolformer_s36' and tnt['speedup'] > 0
    assert abs(tnt['macs'] / by_model['poolformer_s36']['macs'] - 1) < 0.1   # similar MACs: 5.2 G vs 5.0 G
    assert '| tnt_s | 23.77 |' in bench_mlp.markdown(rows)
