"""Equivalence with the official code, through independent re-statements (tests/reference_*.py).

Every family with official code gets a small re-statement of the official forward, written here from the
paper and a reading of the official code (never copied), with the official module names so that its
state dict is in the official layout. Each test loads the same random weights into ours (through our
key mapping where there is one) and compares outputs. Every re-statement was itself checked against the
real official code on the development machine (fetched, run beside it in /tmp, never committed); the
numbers are in each test's docstring and in docs/fidelity.md. CI has no network: these tests are what
guards the semantics there.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import zoo
from reference_canon import canon_step, canon_taps
from reference_poolformer import Block as OfficialPoolBlock
from reference_raftmlp import OfficialRaftMLP
from reference_stripmlp import OfficialStripMLP, TokenMixing
from reference_tnt import OfficialTNTBlock
from reference_weighted_conv import weighted_conv1d_direct, weighted_conv2d_unfold
from zoo.layers.canon import Canon, ShortConv
from zoo.layers.strip import StripTokenMixer
from zoo.layers.weighted_conv import WeightedConv1d, WeightedConv2d
from zoo.metaformer import MetaFormer, MetaFormerBlock
from zoo.raftmlp import RaftMLP
from zoo.stripmlp import StripMLP
from zoo.tnt import TNT, TNTBlock


def randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter and floating buffer redrawn (BN running stats too: mean ~N(0, .5), var in [.5, 2]),
    at a scale that keeps deep stacks finite; zero biases and unit norms would hide mapping mistakes."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.dtype.is_floating_point:
                continue
            if name.endswith('running_var'):
                t.copy_(torch.rand(t.shape, generator=g) * 1.5 + 0.5)
            elif t.ndim <= 1:
                t.copy_(torch.randn(t.shape, generator=g) * 0.5)
            else:
                t.copy_(torch.randn(t.shape, generator=g) / t[0].numel() ** 0.5)
    return module.eval()


def assert_close(ours: torch.Tensor, ref: torch.Tensor, rel: float = 1e-5) -> float:
    """Equal to float rounding: max |diff| within ``rel`` of the largest reference value."""
    diff = (ours - ref).abs().max().item()
    assert diff <= rel * ref.abs().max().item() + 1e-6, f'max |diff| {diff:.3g} vs max |ref| {ref.abs().max():.3g}'
    return diff


def _sub_state(sd: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


# ---- Strip-MLP ---------------------------------------------------------------------------------------

def _strip_mixer_pair(dim: int, size: int) -> tuple[TokenMixing, StripTokenMixer]:
    """The official TokenMixing (re-stated) with random weights, and ours loaded through the model's key map."""
    ref = randomize(TokenMixing(dim, size), seed=dim)
    prefix = 'blocks1.0.token_mixing.'
    mapped = StripMLP.remap_checkpoint({prefix + k: v for k, v in ref.state_dict().items()})
    ours = StripTokenMixer(dim, (size, size)).eval()
    ours.load_state_dict(_sub_state(mapped, 'stages.0.0.token_mixing.'))
    return ref, ours


@pytest.mark.parametrize('dim,size', [(16, 6), (80, 4), (48, 5)])  # p = 4, 2, 4
def test_strip_cgsmm_lsmm_and_token_mixer_match_the_official_forward(dim, size):
    """Re-states Med-Process/Strip_MLP@492d705 ``models/strip_mlp.py``: ``StripMLP_Block.strip_mlp`` (CGSMM),
    the x_2 branch of ``StripMLP_Block.forward`` (LSMM), ``StripMLP_Block.forward`` and ``TokenMixing``.
    Checked on the development machine against the real official ``TokenMixing`` (C = 16, 80, 96, 48 at
    s = 6, 4, 7, 5; random weights incl. BN stats; outputs of magnitude 1.4-1.9): this re-statement max |diff|
    <= 4.8e-7, zoo's ``StripTokenMixer`` <= 3.6e-7, the pre-fix zoo CGSMM 0.87-1.41."""
    ref, ours = _strip_mixer_pair(dim, size)
    torch.manual_seed(1)
    x = torch.randn(2, dim, size, size)
    with torch.no_grad():
        y = ref.smlp_block.mlp(ref.dwsc(x))                    # the CGSMM/LSMM inputs, official path
        y1, y2 = y.chunk(2, dim=1)
        assert_close(ours.strip.cgsmm(y1), ref.smlp_block.cgsmm(y1))
        assert_close(ours.strip.lsmm(y2), ref.smlp_block.lsmm(y2))
        assert_close(ours(x), ref(x))


def test_strip_the_pre_fix_cascade_is_caught():
    """The reading this test guards against (the bug fixed with it): each fuse reading the previous step,
    i.e. ``fuse_h([proj_h(x + pos_h), x + pos_h])`` and ``fuse_w([y, proj_w(y)])``. On the official weights of
    T* it put logits off by up to 38; here it must differ from the official semantics far beyond rounding."""
    ref, ours = _strip_mixer_pair(16, 6)
    m = ours.strip.cgsmm
    x = torch.randn(2, 8, 6, 6)
    with torch.no_grad():
        t = x + m.pos_h()
        t = m.act(m.norm(m.fuse_h(torch.cat([m.proj_h(t), t], 1)))) + m.pos_w()
        sequential = m.fuse_w(torch.cat([t, m.proj_w(t)], 1))
        official = ref.smlp_block.cgsmm(x)
    assert (sequential - official).abs().max() > 1e-2 * official.abs().max()


def test_strip_official_layout_checkpoint_loads_and_round_trips(tmp_path):
    """``zoo.create('stripmlp_tiny', checkpoint=...)`` on a checkpoint in the official layout (``{'model': sd}``,
    ``blocks1.0.token_mixing.smlp_block...``), written by the re-statement of ``StripMLPNet``, gives its
    logits; ``to_official`` is the exact inverse. Checked on the development machine against the real
    official ``StripMLPNet`` at 224 (random weights saved in the official layout, loaded with
    ``zoo.create(name, checkpoint=path)``): max |logit diff| 1.2e-6 (T*), 1.9e-6 (T), 1.4e-6 (S), 1.6e-6 (B),
    logits of magnitude ~7; the pre-fix CGSMM gave 2.1 on the same T* weights. The re-statement of
    ``StripMLPNet`` vs the real one, same state dict: 1.1e-6 (this tiny config), 1.2e-6 (T* at 224)."""
    ref = randomize(OfficialStripMLP(embed_dim=16, layers=(1, 1, 2, 1), img_size=32, num_classes=10), seed=3)
    path = tmp_path / 'official_strip.pth'
    torch.save({'model': ref.state_dict()}, path)
    ours = zoo.create('stripmlp_tiny', num_classes=10, checkpoint=path).eval()
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert_close(ours(x), ref(x))
    back = StripMLP.to_official(ours.state_dict())
    official = ref.state_dict()
    assert back.keys() == official.keys()
    assert all(torch.equal(back[k], official[k]) for k in official)
    assert StripMLP.remap_checkpoint(ours.state_dict()).keys() == ours.state_dict().keys()  # ours passes through
    with pytest.raises(KeyError, match='not a Strip-MLP state dict'):
        StripMLP.remap_checkpoint({'conv.weight': torch.zeros(1)})


# ---- RaftMLP -----------------------------------------------------------------------------------------

def _raft_pair(tmp_path):
    ref = randomize(OfficialRaftMLP(num_classes=10), seed=5)
    path = tmp_path / 'official_raft.pth'
    torch.save(ref.state_dict(), path)
    return ref, zoo.create('raftmlp_tiny', num_classes=10, checkpoint=path).eval()


def test_raft_block_matches_the_official_sub_blocks(tmp_path):
    """Re-states okojoalg/raft-mlp@6060d5d ``libs/modules.py``: one block of ``SerialPermutedLevel`` (RaftShrink,
    ``PermutedBlock`` vertical, the horizontal Rearrange, ``PermutedBlock`` horizontal, RaftExpansion,
    ``ChannelBlock``), incl. the official LayerNorm over channels in (co, r) order. Checked on the development
    machine: zoo RaftMLP-S/M/L vs the real official ``RaftMLP`` (random weights through the loader): max |logit
    diff| 4.8e-7 at 224 and 256 (logits ~2.7); loading without the LayerNorm permutation gives 0.39. This
    re-statement vs the real official ``RaftMLP``, same state dict: 6.0e-7 (the tiny config), 2.7e-7 (S)."""
    ref, ours = _raft_pair(tmp_path)
    torch.manual_seed(6)
    for i, (level, ref_level) in enumerate(zip(ours.levels, ref.levels)):
        grid = level.blocks[0].grid
        t = torch.randn(2, *grid, level.embed.proj.out_features)        # (B, h, w, C) tokens
        with torch.no_grad():
            expected = t
            for sub in ref_level.fn[2]:
                expected = sub(expected)
            assert_close(level.blocks[0](t), expected)


def test_raft_official_layout_checkpoint_loads_and_round_trips(tmp_path):
    """``zoo.create('raftmlp_tiny', checkpoint=...)`` on a checkpoint in the official layout (``levels.i.fn...``,
    ``heads.0.1``, ``classifier``) written by the re-statement of ``RaftMLP`` gives its logits; ``to_official``
    is the exact inverse (see the test above for the numbers against the real official code)."""
    ref, ours = _raft_pair(tmp_path)
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert_close(ours(x), ref(x))
    back, official = ours.to_official(ours.state_dict()), ref.state_dict()
    assert back.keys() == official.keys()
    assert all(torch.equal(back[k], official[k]) for k in official)
    with pytest.raises(KeyError, match='shortcut=True'):
        ours.remap_checkpoint({**official, 'heads.1.1.weight': torch.zeros(1)})


# ---- PoolFormer --------------------------------------------------------------------------------------

def test_poolformer_block_matches_the_official_block():
    """Re-states sail-sg/poolformer ``models/poolformer.py``: ``PoolFormerBlock`` with ``Pooling``
    (avg-pool 3x3, count_include_pad=False, minus the input), GroupNorm(1), the 1x1-conv ``Mlp`` and both layer
    scales (tests/reference_poolformer.py). The whole model through the official-layout loader is in
    tests/test_create.py. Checked on the development machine against the real official ``PoolFormerBlock``
    (random weights, outputs ~4.9): re-statement and zoo both max |diff| 0; zoo poolformer_s12 vs the real
    ``poolformer_s12`` through the official-layout loader: 7.2e-7 (logits ~3.1; issue 13 reported 1.4e-6)."""
    ref = randomize(OfficialPoolBlock(24, 1e-5), seed=8)
    mapped = MetaFormer._remap_official({'network.0.0.' + k: v for k, v in ref.state_dict().items()})
    ours = MetaFormerBlock(24).eval()
    ours.load_state_dict(_sub_state(mapped, 'stages.0.blocks.0.'))
    x = torch.randn(2, 24, 9, 7)
    with torch.no_grad():
        assert_close(ours(x), ref(x))


# ---- TNT ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize('grad', [False, True])  # no_grad takes zoo's in-place inference path
def test_tnt_block_matches_the_official_block(grad):
    """Re-states huawei-noah/CV-Backbones ``tnt_pytorch/tnt.py``: ``Block.forward`` (se=0) with its
    ``Attention`` (separate qk and v Linears) and ``Mlp``; keys mapped by ``TNT.remap_checkpoint``.
    Checked on the development machine against the real official ``Block`` (random weights, outputs ~5):
    re-statement max |diff| 0, zoo 4.8e-7 (words) / 9.5e-7 (sentences); zoo tnt_s vs the real official TNT-S
    through the official-layout loader: 8.9e-7 (logits ~3.0; issue 13 reported 2.4e-6)."""
    c, d, m, n = 8, 32, 16, 5
    ref = randomize(OfficialTNTBlock(d, c, outer_heads=4, inner_heads=2, num_words=m), seed=9)
    sd = {'blocks.0.' + k: v for k, v in ref.state_dict().items()}
    mapped = TNT.remap_checkpoint({**sd, 'outer_pos': torch.zeros(1)})  # outer_pos marks the official layout
    ours = TNTBlock(c, d, num_words=m, inner_heads=2, outer_heads=4).eval()
    ours.load_state_dict(_sub_state(mapped, 'blocks.0.'))
    words, sentences = torch.randn(2 * (n - 1), m, c), torch.randn(2, n, d)
    with torch.set_grad_enabled(grad):
        w_ref, s_ref = ref(words, sentences)
        w_ours, s_ours = ours(words.clone(), sentences.clone())
    assert_close(w_ours.detach(), w_ref.detach())
    assert_close(s_ours.detach(), s_ref.detach())


# ---- weighted convolution ----------------------------------------------------------------------------

@pytest.mark.parametrize('k,den,stride', [(3, [0.7], 1), (5, [0.25, 0.55], 2), (7, [0.25, 0.15, 0.55], 1)])
def test_weighted_conv2d_matches_the_official_definition(k, den, stride):
    """Re-states cammarasana123/weightedConvolution2.0 ``wConv.py`` ``wConv2d.forward`` in the unfold form of
    the v1 ``dConv.py`` (tests/reference_weighted_conv.py). Checked on the development machine: zoo's
    ``WeightedConv2d`` vs the real ``wConv2d`` (same weight, den [0.7] / [0.25, 0.55] / [0.25, 0.15, 0.55],
    strides 1/2/1): max |diff| 0 (bit-identical); the re-statement vs ``wConv2d``: <= 7.2e-7 (outputs ~1-3)."""
    torch.manual_seed(10)
    ours = WeightedConv2d(4, 6, k, stride=stride, padding=k // 2, bias=True, den=den).eval()
    x = torch.randn(2, 4, 11, 11)
    with torch.no_grad():
        assert_close(ours(x), weighted_conv2d_unfold(x, ours.weight, ours.bias, den, stride, k // 2))


def test_weighted_conv1d_matches_the_official_definition():
    """Re-states ``wConv.py`` ``wConv1d.forward`` (weight times alfa, padding 1, no bias) by shifted slices.
    Checked against the real ``wConv1d`` on the development machine: zoo max |diff| 0, the re-statement 2.4e-7
    (``WeightedConv3d`` vs ``wConv3d``: 0)."""
    torch.manual_seed(11)
    ours = WeightedConv1d(3, 5, 5, padding=1, bias=False, den=[0.3, 0.8]).eval()
    x = torch.randn(2, 3, 17)
    with torch.no_grad():
        assert_close(ours(x), weighted_conv1d_direct(x, ours.weight, [0.3, 0.8], padding=1))


# ---- Canon -------------------------------------------------------------------------------------------

@pytest.mark.parametrize('residual,activation,k', [(True, False, 4), (False, True, 4), (True, True, 3),
                                                   (True, False, 2)])
def test_canon_matches_the_official_short_convolution(residual, activation, k):
    """Re-states facebookresearch/PhysicsLM4 ``huggingface/canon_helper.py``: ``ShortConvolution.forward`` on its
    plain-PyTorch path, its ``step`` (rolling cache) and ``apply_canon``'s residual (tests/reference_canon.py).
    Checked on the development machine against the real ``ShortConvolution`` (``use_fast_conv1d=False``,
    transformers' ACT2FN stubbed with SiLU; k = 4, 3, 2; with and without residual and SiLU): zoo's ``Canon``
    max |diff| 0 for the whole sequence and for token-by-token decoding; the re-statement <= 2.4e-7."""
    torch.manual_seed(12)
    ours = Canon(8, k, residual=residual, activation=activation).eval()
    h = torch.randn(2, 9, 8)
    with torch.no_grad():
        assert_close(ours(h), canon_taps(h, ours.conv.weight, residual, activation))
        cache_ours, cache_ref = ours.init_cache(2), torch.zeros(2, 8, k)
        for t in range(h.shape[1]):
            y_ours, cache_ours = ours.step(h[:, t], cache_ours)
            y_ref, cache_ref = canon_step(h[:, t], cache_ref, ours.conv.weight, residual, activation)
            assert_close(y_ours, y_ref)


def test_short_conv_is_the_official_short_convolution_without_residual():
    """``ShortConv`` is fla's ``ShortConvolution`` (SiLU, no residual), as re-stated in tests/reference_canon.py."""
    torch.manual_seed(13)
    ours = ShortConv(6).eval()
    h = torch.randn(1, 7, 6)
    with torch.no_grad():
        assert_close(ours(h), canon_taps(h, ours.conv.weight, residual=False, activation=True))


# ---- the fast inference paths (issue 19) on the full-size grids ----------------------------------------

@pytest.mark.parametrize('onednn', ['1', '0'])
def test_strip_and_raft_fast_inference_at_224_match_the_restatements(onednn, monkeypatch):
    """Narrow Strip-MLP and RaftMLP built for 224 (grids 56/28/14/7, so every fast path runs: oneDNN convs
    with BN folded and GELU fused, oneDNN linears, addcmul GRN/LSMM, raft rows through oneDNN and batched
    products, tokens stored (B, w, h, C)), random weights and BN statistics, in inference mode, against the
    re-statements of the official forwards; with and without oneDNN (``ZOO_ONEDNN=0``)."""
    monkeypatch.setenv('ZOO_ONEDNN', onednn)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(6))
    ref = randomize(OfficialStripMLP(embed_dim=16, layers=(1, 1, 2, 1), img_size=224, num_classes=10), seed=7)
    ours = StripMLP(embed_dim=16, depths=(1, 1, 2, 1), num_classes=10, img_size=224, drop_path_rate=0.0)
    ours.load_state_dict(StripMLP.remap_checkpoint(ref.state_dict()))
    with torch.inference_mode():
        assert_close(ours.eval()(x), ref(x))
    ref = randomize(OfficialRaftMLP(dims=(8, 16, 16, 24), depths=(2, 1, 2, 1), img_size=224, num_classes=10), seed=8)
    ours = RaftMLP(dims=(8, 16, 16, 24), depths=(2, 1, 2, 1), num_classes=10, drop_path_rate=0.0)
    ours.load_state_dict(ours.remap_checkpoint(ref.state_dict()))
    with torch.inference_mode():
        assert_close(ours.eval()(x), ref(x))
