"""Strip-MLP: official counts, the strip layer against a direct loop, the official quirks, the size error,
features and the MetaFormer swap."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import zoo
from zoo import layers
from zoo.eval.profile import count_macs
from zoo.layers.strip import LocalStripMixing, RelativePosition, StripMLPLayer, StripTokenMixer, strip_groups
from zoo.stripmlp import GRN, StripBlock

# Conv + linear + matmul MACs ("core MACs") counted on the official code at 224 (reference page).
CORE_MACS = {'stripmlp_t_star': 2_518_593_280, 'stripmlp_t': 3_648_236_800, 'stripmlp_s': 6_803_134_464,
             'stripmlp_b': 9_184_947_968}


@pytest.mark.parametrize('name', sorted(CORE_MACS))
def test_official_params_and_core_macs(name):
    with torch.device('meta'):
        model = zoo.create(name)
    assert sum(p.numel() for p in model.parameters()) == zoo.model_info(name).params
    assert count_macs(model, (3, 224, 224)) == CORE_MACS[name]


def test_per_block_params_of_t_star_and_b():
    with torch.device('meta'):
        t, b = zoo.create('stripmlp_t_star'), zoo.create('stripmlp_b')
    assert [sum(p.numel() for p in s[0].parameters()) for s in t.stages] == [456_300, 458_520, 1_110_000, 4_013_280]
    assert [sum(p.numel() for p in s[0].parameters()) for s in b.stages] == [407_876, 644_840, 2_031_344, 7_763_168]


@pytest.mark.parametrize('dim,s', [(32, 6), (80, 4), (48, 5)])
def test_block_params_follow_the_closed_form(dim, s):
    g = dim // (2 * strip_groups(dim))
    expected = 9.5 * dim ** 2 + 98.75 * dim + (2 * s + 1) * dim + 6 * s * s * g + 2 * s * g
    with torch.device('meta'):
        block = StripBlock(dim, s)
    assert sum(p.numel() for p in block.parameters()) == expected


def test_group_factor_follows_the_width_rule():
    assert [strip_groups(c) for c in (80, 160, 320, 640, 96, 112, 448, 16)] == [2, 2, 2, 2, 4, 4, 4, 4]
    with torch.device('meta'):
        t, s = zoo.create('stripmlp_t'), zoo.create('stripmlp_s')
    # p patches of g channels on half the width: g = C / (2p) is the strip layer's group count
    assert t.stages[0][0].token_mixing.strip.cgsmm.proj_h.g == 80 // 4
    assert s.stages[0][0].token_mixing.strip.cgsmm.proj_h.g == 96 // 8


@pytest.mark.parametrize('axis', ['w', 'h'])
def test_strip_layer_equals_a_direct_loop(axis):
    torch.manual_seed(0)
    n, p, g, s = 2, 2, 3, 4
    layer = StripMLPLayer(g, s, axis)
    x = torch.randn(n, p * g, s, s)
    y = layer(x)
    wt, bias = layer.proj.weight, layer.proj.bias  # (g*s, s, 1, 3), (g*s,)
    ref = torch.zeros_like(x)
    for c1 in range(p):
        for c2 in range(g):
            ch = c1 * g + c2
            for line in range(s):          # the row (axis 'w') or column (axis 'h') being written
                for out in range(s):       # position along it
                    acc = bias[c2 * s + out].expand(n).clone()
                    for d in (-1, 0, 1):   # the neighbouring strips read (cross-strip aggregation)
                        nb = line + d
                        if not 0 <= nb < s:
                            continue
                        src = x[:, ch, nb, :] if axis == 'w' else x[:, ch, :, nb]  # (n, s)
                        acc = acc + src @ wt[c2 * s + out, :, 0, d + 1]
                    if axis == 'w':
                        ref[:, ch, line, out] = acc
                    else:
                        ref[:, ch, out, line] = acc
    assert torch.allclose(y, ref, atol=1e-5)


def test_relative_position_is_toeplitz():
    rp = RelativePosition(3, 5)
    bias = rp()
    assert bias.shape == (3, 5, 5)
    for q in range(5):
        for k in range(5):
            assert torch.equal(bias[:, q, k], rp.table[k - q + 5])


def test_lsmm_is_a_softmax_weighted_sum_of_its_three_branches():
    torch.manual_seed(0)
    m = LocalStripMixing(16)
    x = torch.randn(2, 8, 6, 6)
    a, b = m.strip_w(x), m.strip_h(x)
    att = m.reweight((a + b + x).mean((2, 3), keepdim=True)).view(2, 8, 3).softmax(-1)  # (N, C', 3)
    ref = b * att[..., 0, None, None] + a * att[..., 1, None, None] + x * att[..., 2, None, None]
    assert torch.allclose(m(x), ref, atol=1e-6)
    assert m.reweight[0].out_channels == 16 // 4  # hidden = a quarter of the full block width


def test_grn_is_identity_at_init_and_matches_the_formula():
    grn = GRN(6)
    x = torch.randn(2, 4, 4, 6)
    assert torch.equal(grn(x), x)
    grn.gamma, grn.beta = nn.Parameter(torch.randn(6)), nn.Parameter(torch.randn(6))
    gx = x.pow(2).sum((1, 2), keepdim=True).sqrt()
    ref = grn.gamma * x * (gx / (gx.mean(-1, keepdim=True) + 1e-6)) + grn.beta + x
    assert torch.allclose(grn(x), ref, atol=1e-5)


def test_drop_path_is_hard_wired_to_a_constant():
    with torch.device('meta'):
        model = zoo.create('stripmlp_t')
    rates = [m.p for m in model.modules() if isinstance(m, layers.DropPath)]
    assert len(rates) == sum((2, 2, 12, 2)) and set(rates) == {0.1}


def test_a_mismatched_size_names_the_size_it_was_built_for():
    model = zoo.create('stripmlp_tiny').eval()
    with pytest.raises(ValueError, match='built for 32x32'):
        model(torch.randn(1, 3, 64, 64))
    with torch.device('meta'):
        full = zoo.create('stripmlp_t_star')
        with pytest.raises(ValueError, match='built for 224x224'):
            full(torch.zeros(1, 3, 256, 256))
        assert zoo.create('stripmlp_t_star', img_size=256)(torch.zeros(1, 3, 256, 256)).shape == (1, 1000)
    with pytest.raises(ValueError, match='built for a 8x8 token grid'):
        StripTokenMixer(16, (8, 8))(torch.randn(1, 16, 7, 7))


def test_params_at_other_sizes_and_class_counts():
    with torch.device('meta'):
        assert sum(p.numel() for p in zoo.create('stripmlp_t_star', img_size=256).parameters()) == 18_810_320
        assert sum(p.numel() for p in zoo.create('stripmlp_b', img_size=128).parameters()) == 55_696_416
        assert sum(p.numel() for p in zoo.create('stripmlp_s', num_classes=100).parameters()) == 41_876_500


def test_features_only_stages():
    with torch.device('meta'):
        model = zoo.create('stripmlp_t_star', features_only=True)
        feats = model(torch.zeros(1, 3, 224, 224))
    assert [tuple(f.shape) for f in feats] == [(1, 80, 56, 56), (1, 160, 28, 28), (1, 320, 14, 14), (1, 640, 7, 7)]
    assert [(i['num_chs'], i['reduction']) for i in model.feature_info] == [(80, 4), (160, 8), (320, 16), (640, 32)]


def test_strip_mixer_record_and_metaformer_swap_trains():
    rec = layers.record('token_mixer', 'strip')
    assert rec.layout == 'nchw' and rec.fixed_size
    torch.manual_seed(0)
    model = zoo.create('metaformer_tiny', num_classes=10, token_mixer='strip')
    assert [s.blocks[0].token_mixer.size for s in model.stages] == [8, 4, 2, 1]
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(5):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_metaformer_s12_with_strip_needs_the_input_size():
    with torch.device('meta'):
        model = zoo.create('metaformer_s12', num_classes=10, token_mixer='strip', img_size=32)
        assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
        default = zoo.create('metaformer_s12', token_mixer='strip')  # built for 224: grids 56/28/14/7
    with pytest.raises(ValueError, match='built for a 56x56 token grid'):
        default(torch.zeros(1, 3, 32, 32, device='meta'))


@pytest.mark.parametrize('name,embed_dim,depths', [('stripmlp_t_star', 80, (2, 2, 6, 2)),
                                                    ('stripmlp_s', 96, (2, 2, 18, 2))])
def test_official_layout_of_full_size_models_maps_key_for_key(name, embed_dim, depths):
    """Every key and shape of a full-size official state dict (p = 2 for T*, 4 for S) maps onto ours and back;
    built on the meta device from the re-statement in tests/reference_stripmlp.py (outputs: test_fidelity)."""
    from reference_stripmlp import OfficialStripMLP
    from zoo.stripmlp import StripMLP
    with torch.device('meta'):
        official = OfficialStripMLP(embed_dim, depths, img_size=224, num_classes=1000).state_dict()
        ours = zoo.create(name).state_dict()
    mapped = StripMLP.remap_checkpoint(official)
    assert mapped.keys() == ours.keys()
    assert all(mapped[k].shape == ours[k].shape for k in ours)
    assert StripMLP.to_official(ours).keys() == official.keys()
