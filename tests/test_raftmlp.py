"""RaftMLP: official counts, the raft mixing in closed form, other resolutions, features, MetaFormer swap."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo import layers
from zoo.eval.profile import count_macs
from zoo.layers.raft import RaftMixing, RaftTokenMixer
from zoo.raftmlp import RaftBlock

# Conv + linear + matmul MACs ("core MACs") counted on the official code at 224 (reference page).
CORE_MACS = {'raftmlp_s': 2_087_030_784, 'raftmlp_m': 4_267_333_632, 'raftmlp_l': 6_543_974_400}


@pytest.mark.parametrize('name', sorted(CORE_MACS))
def test_official_params_and_core_macs(name):
    with torch.device('meta'):
        model = zoo.create(name)
    assert sum(p.numel() for p in model.parameters()) == zoo.model_info(name).params
    assert count_macs(model, (3, 224, 224)) == CORE_MACS[name]


def test_per_level_params_of_raftmlp_s():
    with torch.device('meta'):
        model = zoo.create('raftmlp_s')
    per_level = [sum(p.numel() for p in lv.parameters()) for lv in model.levels]
    assert per_level == [284_416, 479_776, 3_856_880, 4_733_672]
    assert sum(p.numel() for p in model.norm.parameters()) == 1_024
    assert sum(p.numel() for p in model.head.parameters()) == 513_000


@pytest.mark.parametrize('dim,s,r', [(16, 6, 2), (24, 5, 4)])
def test_block_params_follow_the_closed_form(dim, s, r):
    block = RaftBlock(dim, (s, s), raft_size=r)
    assert sum(p.numel() for p in block.parameters()) == 8 * dim ** 2 + 11 * dim + 8 * (r * s) ** 2 + 6 * r * s


@pytest.mark.parametrize('axis', ['h', 'w'])
def test_raft_mixing_equals_a_direct_loop_over_strided_rafts(axis):
    torch.manual_seed(0)
    b, h, w, c, r = 2, 3, 4, 6, 2
    mix = RaftMixing(c, h if axis == 'h' else w, axis, raft_size=r)
    x = torch.randn(b, h, w, c)
    y = mix(x)
    ref = torch.zeros_like(x)
    n_rafts = c // r
    mlp = lambda v: mix.fc2(F.gelu(mix.fc1(v)))  # noqa: E731
    for co in range(n_rafts):
        chans = [j * n_rafts + co for j in range(r)]  # strided raft: co, co + C/r, ...
        for other in range(w if axis == 'h' else h):
            if axis == 'h':  # vector (r, h) flattened, r outer
                v = torch.stack([x[:, :, other, ch] for ch in chans], 1).reshape(b, r * h)
                ref_v = mlp(v).reshape(b, r, h)
                for j, ch in enumerate(chans):
                    ref[:, :, other, ch] = ref_v[:, j]
            else:
                v = torch.stack([x[:, other, :, ch] for ch in chans], 1).reshape(b, r * w)
                ref_v = mlp(v).reshape(b, r, w)
                for j, ch in enumerate(chans):
                    ref[:, other, :, ch] = ref_v[:, j]
    assert torch.allclose(y, ref, atol=1e-5)


def test_rafts_are_strided_not_contiguous():
    torch.manual_seed(0)
    mix = RaftMixing(8, 4, 'h', raft_size=2)  # rafts {0, 4}, {1, 5}, {2, 6}, {3, 7}
    x = torch.randn(1, 4, 4, 8)
    x2 = x.clone()
    x2[..., 0] += 1.0
    changed = (mix(x2) - mix(x)).abs().amax(dim=(0, 1, 2)) > 0
    assert changed.tolist() == [True, False, False, False, True, False, False, False]


def test_other_resolutions_resize_the_grid_bicubically():
    torch.manual_seed(0)
    block = RaftBlock(8, (4, 4)).eval()
    x = torch.randn(2, 6, 6, 8)  # (B, h, w, C) on a 6x6 grid, trained on 4x4
    up = lambda t, size: F.interpolate(t.permute(0, 3, 1, 2), size=size, mode='bicubic',  # noqa: E731
                                       align_corners=False).permute(0, 2, 3, 1)
    t = up(x, (4, 4))
    t = t + block.vertical(block.norm1(t))
    t = t + block.horizontal(block.norm2(t))
    t = up(t, (6, 6))
    ref = t + block.mlp(block.norm3(t))
    assert torch.allclose(block(x), ref, atol=1e-5)


@pytest.mark.parametrize('size,gmacs', [(224, None), (256, 2.582), (160, 1.333)])
def test_one_model_serves_224_256_and_160(size, gmacs):
    with torch.device('meta'):
        model = zoo.create('raftmlp_s')
        out = model(torch.zeros(1, 3, size, size))
    assert out.shape == (1, 1000)
    if gmacs:  # fvcore totals on the official code; ours counts conv/linear only (about 0.7 % less)
        assert abs(count_macs(model, (3, size, size)) / 1e9 - gmacs) / gmacs < 0.02


def test_tiny_runs_at_sizes_it_was_not_built_for():
    model = zoo.create('raftmlp_tiny', num_classes=10).eval()
    with torch.no_grad():
        for size in (32, 48, 30):  # 30: levels bicubically pad up to a multiple of their patch
            out = model(torch.randn(2, 3, size, size))
            assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_features_only_levels():
    with torch.device('meta'):
        model = zoo.create('raftmlp_s', features_only=True)
        feats = model(torch.zeros(1, 3, 224, 224))
    assert [tuple(f.shape) for f in feats] == [(1, 64, 56, 56), (1, 128, 28, 28), (1, 256, 14, 14), (1, 512, 7, 7)]
    assert [(i['num_chs'], i['reduction']) for i in model.feature_info] == [(64, 4), (128, 8), (256, 16), (512, 32)]
    tiny = zoo.create('raftmlp_tiny', features_only=True, out_indices=(1, 3))
    assert [tuple(f.shape) for f in tiny(torch.randn(1, 3, 32, 32))] == [(1, 48, 4, 4), (1, 96, 1, 1)]


def test_drop_path_is_the_same_on_every_sub_block():
    with torch.device('meta'):
        model = zoo.create('raftmlp_m')
    rates = {m.p for m in model.modules() if isinstance(m, layers.DropPath)}
    assert rates == {0.1}


def test_raft_mixer_record_and_metaformer_swap_trains():
    rec = layers.record('token_mixer', 'raft')
    assert rec.layout == 'nchw' and rec.fixed_size
    torch.manual_seed(0)
    model = zoo.create('metaformer_tiny', num_classes=10, token_mixer='raft')
    assert isinstance(model.stages[0].blocks[0].token_mixer, RaftTokenMixer)
    assert model.stages[0].blocks[0].token_mixer.grid == (8, 8)  # metaformer_tiny is built for 32x32
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


def test_metaformer_s12_with_raft_builds_with_the_s12_grids():
    with torch.device('meta'):
        model = zoo.create('metaformer_s12', token_mixer='raft')
        assert model(torch.zeros(1, 3, 224, 224)).shape == (1, 1000)
    assert [s.blocks[0].token_mixer.grid for s in model.stages] == [(56, 56), (28, 28), (14, 14), (7, 7)]


@pytest.mark.parametrize('name,dims', [('raftmlp_s', (64, 128, 256, 512)), ('raftmlp_l', (128, 192, 512, 1024))])
def test_official_layout_of_full_size_models_maps_key_for_key(name, dims):
    """Every key and shape of a full-size official state dict maps onto ours and back; built on the meta device
    from the re-statement in tests/reference_raftmlp.py (outputs: test_fidelity)."""
    from reference_raftmlp import OfficialRaftMLP
    with torch.device('meta'):
        official = OfficialRaftMLP(dims=dims, depths=(2, 2, 6, 2), img_size=224, num_classes=1000).state_dict()
        model = zoo.create(name)
    ours = model.state_dict()
    mapped = model.remap_checkpoint(official)
    assert mapped.keys() == ours.keys()
    assert all(mapped[k].shape == ours[k].shape for k in ours)
    assert model.to_official(ours).keys() == official.keys()


# ---- the fast paths compute the plain function (issue 19) ----------------------------------------------------

def _close(fast: torch.Tensor, plain: torch.Tensor) -> None:
    diff = (fast - plain).abs().max().item()
    assert diff <= 1e-5 * plain.abs().max().item(), f'max |diff| {diff:.3g} vs max |plain| {plain.abs().max():.3g}'


@pytest.mark.parametrize('onednn', ['1', '0'])
@pytest.mark.parametrize('axis, length', [('h', 8), ('w', 8), ('h', 28), ('w', 28)])
def test_raft_mixing_forward_equals_the_plain_form(axis, length, onednn, monkeypatch):
    """Batched products on the tokens in place (short rafts, and every autograd call), and the oneDNN
    row GEMMs (rafts of r*L >= 48 values, inference) against ``reference`` (einops + nn.Linear), for tokens
    stored either way."""
    from zoo.layers.raft import RaftMixing
    monkeypatch.setenv('ZOO_ONEDNN', onednn)
    torch.manual_seed(0)
    mix = RaftMixing(12, length, axis).eval()
    x = torch.randn(2, length, length, 12)
    for tokens in (x, x.transpose(1, 2).contiguous().transpose(1, 2)):
        plain = mix.reference(tokens)
        with torch.inference_mode():
            _close(mix(tokens), plain)
        _close(mix(tokens).detach(), plain.detach())


def test_cross_scale_embedding_as_convolutions_equals_unfold_and_linear():
    from zoo.raftmlp import CrossScaleEmbedding, RaftMLP
    torch.manual_seed(0)
    for cin, kernels, size in ((3, (4, 8), 32), (5, (2, 4), 12), (6, (2,), 6)):
        emb = CrossScaleEmbedding(cin, 7, kernels)
        x = torch.randn(2, cin, size, size)
        _close(emb(x).detach(), emb.reference(x).detach())


def test_inference_path_equals_the_plain_path_on_the_full_size_grids(monkeypatch):
    """A narrow RaftMLP at 224 (grids 56/28/14/7, so every path runs): inference (oneDNN rows, batched
    products, tokens stored (B, w, h, C) between blocks, in-place residuals) against the plain path
    (autograd, einops + nn.Linear raft mixings, unfold embedding)."""
    from zoo.layers.raft import RaftMixing
    from zoo.raftmlp import CrossScaleEmbedding, RaftMLP
    torch.manual_seed(0)
    model = RaftMLP(dims=(8, 16, 16, 24), depths=(2, 1, 2, 1), num_classes=10).eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        fast = model(x)
    monkeypatch.setattr(RaftMixing, 'forward', RaftMixing.reference)
    monkeypatch.setattr(CrossScaleEmbedding, 'forward', CrossScaleEmbedding.reference)
    _close(fast, model(x).detach())
