"""Causal LM families with Canon placements, chunked scans and the CausalLM recipe (issue 7)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo.layers.canon import Canon, ShortConv
from zoo.layers.sequence_mixers import (CausalSelfAttention, apply_rope, gla_chunked, gla_recurrent, ssd_chunked,
                                        ssd_recurrent)

FAMILIES = ['llama_tiny', 'gla_tiny', 'mamba2_tiny']
D = 32  # width for the placement tests (tiny variants overridden to d = 32)


def build(name, seed=0, **kw):
    torch.manual_seed(seed)
    return zoo.create(name, dim=D, **kw).eval()


def tokens(b=2, t=21, vocab=64, seed=0):
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def canon_b_width(model):
    mixer = model.blocks[0].mixer
    return mixer.qkv.out_features if hasattr(mixer, 'qkv') else mixer.in_proj.out_features


@pytest.mark.parametrize('name', FAMILIES)
def test_empty_canon_is_the_baseline_exactly(name):
    x = tokens()
    base = build(name)
    with torch.no_grad():
        ref = base(x)
        assert torch.equal(build(name, canon='')(x), ref)
        # same seed: every non-Canon weight is identical whatever the Canon set is ...
        full = build(name, canon='ABCD')
        shared = {k: v for k, v in full.state_dict().items() if 'canon' not in k}
        assert shared.keys() == base.state_dict().keys()
        assert all(torch.equal(v, base.state_dict()[k]) for k, v in shared.items())
        # ... and zeroed (residual) Canon layers give the baseline's outputs bit for bit
        for m in full.modules():
            if isinstance(m, Canon) and not isinstance(m, ShortConv):   # the linear models' own conv stays
                m.conv.weight.zero_()
        assert torch.equal(full(x), ref)


@pytest.mark.parametrize('name', FAMILIES)
def test_each_canon_point_adds_4m_parameters(name):
    base = build(name)
    hidden = base.blocks[0].mlp.hidden
    width = {'A': D, 'B': canon_b_width(base), 'C': D, 'D': 2 * hidden}
    depth = len(base.blocks)
    for point, m in width.items():
        assert n_params(build(name, canon=point)) - n_params(base) == 4 * m * depth, point
    assert n_params(build(name, canon='ABCD')) - n_params(base) == 4 * sum(width.values()) * depth
    if name == 'llama_tiny':
        assert width['B'] == 3 * D and width['D'] == 2 * int(8 * D / 3)


def test_canon_points_see_the_documented_inputs():
    """A / C act on the normed stream, B on concat[q, k, v] (the qkv projection's output), D on concat[gate, up]."""
    model = build('llama_tiny', canon='ABCD')
    blk, seen = model.blocks[0], {}
    for key, mod in (('A', blk.canon_a), ('B', blk.mixer.canon_b), ('C', blk.canon_c), ('D', blk.mlp.canon_d)):
        mod.register_forward_hook(lambda m, i, o, key=key: seen.__setitem__(key, i[0]))
    x = tokens()
    with torch.no_grad():
        model(x)
        h = model.embed(x)
        assert torch.equal(seen['A'], blk.norm1(h))
        assert torch.equal(seen['B'], blk.mixer.qkv(blk.canon_a(blk.norm1(h))))
        h2 = h + blk.mixer(blk.canon_a(blk.norm1(h)))
        assert torch.allclose(seen['C'], blk.norm2(h2), atol=1e-6)
        assert torch.allclose(seen['D'], blk.mlp.gate_up(blk.canon_c(blk.norm2(h2))), atol=1e-6)


@pytest.mark.parametrize('name,kw', [('llama_tiny', dict(rope_dim=0, canon='ABCD')), ('llama_tiny', dict(rope_dim=8)),
                                     ('gla_tiny', dict(canon='ABCD')), ('mamba2_tiny', dict(canon='ABCD'))])
def test_logits_are_causal(name, kw):
    model = build(name, **kw)
    x = tokens(t=40)
    x2 = x.clone()
    x2[:, 25] = (x2[:, 25] + 1) % 64
    with torch.no_grad():
        y, y2 = model(x), model(x2)
    assert torch.equal(y[:, :25], y2[:, :25])
    assert not torch.allclose(y[:, 25:], y2[:, 25:])


def test_nope_has_no_positional_signal_and_partial_rope_differs():
    torch.manual_seed(0)
    q = torch.randn(1, 2, 5, 16)
    assert torch.equal(apply_rope(q, 0), q)
    part = apply_rope(q, 8)
    assert torch.equal(part[..., 8:], q[..., 8:]) and not torch.equal(part[..., :8], q[..., :8])
    # RoPE: scores depend on relative positions only
    k = torch.randn(1, 2, 5, 16)
    s0 = apply_rope(q, 16) @ apply_rope(k, 16).transpose(-1, -2)
    s3 = apply_rope(q, 16, offset=3) @ apply_rope(k, 16, offset=3).transpose(-1, -2)
    assert torch.allclose(s0, s3, atol=1e-5)
    with pytest.raises(ValueError, match='rope_dim'):
        CausalSelfAttention(32, 2, rope_dim=5)
    with pytest.raises(ValueError, match='attention mixer only'):
        zoo.create('gla_tiny', rope_dim=0)


def test_rope_heads_half_the_heads_at_half_dims(one_thread):
    """``rope_heads=0.5, rope_dim=hd/2``: only the first half of the dims of the first half of the heads rotate;
    the NoPE heads' scores ignore where q and k sit, the RoPE heads' scores follow their relative position."""
    attn = CausalSelfAttention(64, num_heads=4, rope_dim=8, rope_heads=0.5)             # head_dim 16
    assert attn.rope_heads == 2
    torch.manual_seed(0)
    q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 4, 6, 16)
    r = attn.rope(q, offset=3)
    assert torch.equal(r[:, 2:], q[:, 2:]) and torch.equal(r[:, :2, :, 8:], q[:, :2, :, 8:])
    assert not torch.allclose(r[:, :2, :, :8], q[:, :2, :, :8])
    same = attn.rope(q) @ attn.rope(k).transpose(-1, -2)
    moved = attn.rope(q, offset=5) @ attn.rope(k).transpose(-1, -2)                # q 5 positions further on
    assert torch.equal(moved[:, 2:], same[:, 2:])                                  # NoPE heads: no change
    assert not torch.allclose(moved[:, :2], same[:, :2], atol=1e-3)                # RoPE heads: relative shift
    both = attn.rope(q, offset=5) @ attn.rope(k, offset=5).transpose(-1, -2)
    assert torch.allclose(both, same, atol=1e-5)
    # in a model: same parameters as RoPE, different function, and cached decoding still equals the forward
    model = build('llama_tiny', num_heads=4, rope_heads=0.5, rope_dim=4)
    rope = build('llama_tiny', num_heads=4)
    assert n_params(model) == n_params(rope) and model.blocks[0].mixer.rope_heads == 2
    x = tokens(t=12)
    with torch.no_grad():
        full = model(x)
        assert not torch.allclose(full, rope(x), atol=1e-4)
        cache = model.init_cache()
        steps = torch.cat([model(x[:, :3], cache)] + [model(x[:, t:t + 1], cache) for t in range(3, 12)], 1)
        assert torch.allclose(steps, full, atol=1e-5)
    for bad in (0.3, 0, 1.5):
        with pytest.raises(ValueError, match='rope_heads'):
            CausalSelfAttention(64, num_heads=4, rope_heads=bad)
    with pytest.raises(ValueError, match='attention mixer only'):
        zoo.create('gla_tiny', rope_heads=0.5)


@pytest.mark.parametrize('gate_shift', [0.0, 6.0, -8.0])
@pytest.mark.parametrize('t,chunk', [(64, 16), (50, 16), (7, 32)])
def test_chunked_gla_equals_recurrent(t, chunk, gate_shift):
    """Mixed gates, weak gates (factorised intra-chunk decays) and strong gates (a chunk's log-decay beyond 60:
    the explicit decay-ratio path)."""
    torch.manual_seed(t)
    q, k = torch.randn(2, 3, t, 8), torch.randn(2, 3, t, 8)
    v = torch.randn(2, 3, t, 5)
    log_a = F.logsigmoid(3 * torch.randn(2, 3, t, 8) + gate_shift)
    s0 = torch.randn(2, 3, 8, 5)
    o1, s1 = gla_recurrent(q, k, v, log_a, s0)
    o2, s2 = gla_chunked(q, k, v, log_a, chunk, s0)
    assert torch.allclose(o1, o2, atol=1e-4) and torch.allclose(s1, s2, atol=1e-4)


@pytest.mark.parametrize('t,chunk', [(64, 16), (50, 16), (7, 32)])
def test_chunked_ssd_equals_recurrent(t, chunk):
    torch.manual_seed(t)
    x, dt = torch.randn(2, t, 3, 4), F.softplus(torch.randn(2, t, 3))
    a, bm, cm = -torch.rand(3) * 4, torch.randn(2, t, 6), torch.randn(2, t, 6)
    s0 = torch.randn(2, 3, 4, 6)
    y1, s1 = ssd_recurrent(x, dt, a, bm, cm, s0)
    y2, s2 = ssd_chunked(x, dt, a, bm, cm, chunk, s0)
    assert torch.allclose(y1, y2, atol=1e-4) and torch.allclose(s1, s2, atol=1e-4)


@pytest.mark.parametrize('canon', ['', 'ABCD'])
@pytest.mark.parametrize('name', FAMILIES)
def test_cached_decoding_equals_full_forward(name, canon, one_thread):
    """KV cache / recurrent state + short-conv and Canon windows: a prompt, a multi-token continuation and then
    one token at a time give the full forward's logits at every position; greedy cached generation equals the
    uncached one (which re-runs the prefix)."""
    model = build(name, canon=canon, depth=2)
    x = tokens(t=40)
    with torch.no_grad():
        full = model(x)
        cache = model.init_cache()
        parts = [model(x[:, :5], cache), model(x[:, 5:23], cache)]       # 18 tokens: spans a scan chunk edge
        parts += [model(x[:, t:t + 1], cache) for t in range(23, 40)]
        assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)
        blk = cache[0]['mixer']
        if name == 'llama_tiny':
            assert blk['k'].shape[2] == 40                              # every key kept, at its absolute position
        else:
            assert 'state' in blk and blk['conv'].shape[-1] == 4       # the recurrent state and Canon-b window
        assert ('canon_a' in cache[0]) == bool(canon) and ('canon_d' in cache[0]['mlp']) == bool(canon)
        # a random model's greedy output is near-constant: sharpen it so the continuations differ by position
        model.head.weight.mul_(30)
        prompt = x[:, :7]
        cached, uncached = model.generate(prompt, 15), model.generate(prompt, 15, use_cache=False)
        assert torch.equal(cached, uncached) and cached.shape == (2, 22) and torch.equal(cached[:, :7], prompt)
        with pytest.raises(ValueError, match='init_cache'):
            model(x, cache=[{}])


def test_chunked_scans_backpropagate_like_the_references():
    """Training goes through the chunked scans: their gradients equal the token-by-token references'."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 40, 8), torch.randn(2, 3, 40, 8), torch.randn(2, 3, 40, 5)
    log_a = F.logsigmoid(torch.randn(2, 3, 40, 8))
    x, dt = torch.randn(2, 40, 3, 4), F.softplus(torch.randn(2, 40, 3))
    a, bm, cm = -torch.rand(3) * 4, torch.randn(2, 40, 6), torch.randn(2, 40, 6)
    for fast, ref, args in ((lambda *z: gla_chunked(*z, chunk=16), gla_recurrent, (q, k, v, log_a)),
                            (lambda *z: ssd_chunked(*z, chunk=16), ssd_recurrent, (x, dt, a, bm, cm))):
        args = [z.clone().requires_grad_() for z in args]
        g_fast = torch.autograd.grad(fast(*args)[0].square().sum(), args)
        g_ref = torch.autograd.grad(ref(*args)[0].square().sum(), args)
        for gf, gr in zip(g_fast, g_ref):
            assert torch.allclose(gf, gr, rtol=1e-4, atol=1e-3 * gr.abs().max().item())


def test_bad_inputs_have_clear_errors():
    model = zoo.create('llama_tiny')
    with pytest.raises(ValueError, match='integer token ids'):
        model(torch.randn(2, 8))
    with pytest.raises(ValueError, match="subset of 'ABCD'"):
        zoo.create('llama_tiny', canon='AE')



@pytest.mark.parametrize('name', FAMILIES)
def test_short_training_lowers_loss(name, one_thread):
    """Every family (with Canon-ABCD) fits a fixed batch of copy-probe windows."""
    from zoo.datasets.synthetic import make_task
    from zoo.datasets.synthetic_data import SyntheticWindows
    task = make_task('copy', N=12)
    ds = SyntheticWindows(task, 26, 8, seed=0)
    batch = {k: torch.stack([ds[i][k] for i in range(8)]) for k in ds[0]}
    torch.manual_seed(0)
    model = zoo.create(name, vocab_size=task.vocab_size, canon='ABCD', dim=32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-6)
    sel = batch['answer'] >= 0
    losses = []
    for _ in range(25):
        loss = F.cross_entropy(model(batch['input'])[sel], batch['target'][sel])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses[::10]


def test_canon_bench_functions_report_equal_scans_and_both_generation_speeds(one_thread):
    """The benchmark's own checks at a tiny size: the chunked scans match their references, and every model
    row carries training and cached / uncached generation throughput."""
    from benchmarks.canon_bench import scans, throughput
    rows = scans(40, repeats=1)
    assert [r['scan'] for r in rows] == ['gla', 'ssd'] and all(r['max_abs_diff'] < 1e-4 for r in rows)
    lm = throughput(depth=1, dim=32, t=16, batch=2, gen_tokens=3, repeats=1)
    assert {r['model'] for r in lm} == {'llama', 'llama+ABCD', 'gla', 'gla+ABCD', 'mamba2', 'mamba2+ABCD'}
    assert all(r['generate_tokens_per_s'] > 0 and r['generate_uncached_tokens_per_s'] > 0 for r in lm)
