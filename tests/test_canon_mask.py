"""Canon layers and the Canon language models with an attention (padding) mask.

The official ``apply_canon`` (facebookresearch/PhysicsLM4 ``huggingface/canon_helper.py``) takes HF's 2-d mask
(1 = token, 0 = padding), slices its last T columns and zeroes the padded inputs before the convolution. Here the
whole model honours the mask (Canon A/B/C/D, attention keys and RoPE positions, the GLA / Mamba2 recurrences), so
a padded batch gives each sequence's own logits; that is what these tests check, against the sequences run one by
one without padding.
"""
from __future__ import annotations

import pytest
import torch

import zoo
from zoo.layers.canon import Canon

FAMILIES = ['llama_tiny', 'gla_tiny', 'mamba2_tiny']


def _padded(seqs, side: str):
    t = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), t, dtype=torch.long)
    mask = torch.zeros(len(seqs), t, dtype=torch.long)
    for i, s in enumerate(seqs):
        where = slice(t - len(s), t) if side == 'left' else slice(0, len(s))
        tokens[i, where], mask[i, where] = s, 1
    return tokens, mask


def test_canon_mask_zeroes_padded_inputs_before_the_conv():
    torch.manual_seed(0)
    layer = Canon(6, kernel_size=4)
    h = torch.randn(2, 7, 6)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]])
    zeroed = h * mask[..., None]
    y = layer(h, mask)
    assert torch.allclose(y - h, layer(zeroed) - zeroed, atol=1e-6)    # the conv part sees zeros at padding
    # left padding: the real tokens get exactly the unpadded sequence's outputs
    assert torch.allclose(y[0, 2:], layer(h[0:1, 2:])[0], atol=1e-6)
    # a non-finite value at a padded position does not leak into real positions
    h_bad = h.clone()
    h_bad[0, 1] = float('nan')
    assert torch.isfinite(layer(h_bad, mask)[0, 2:]).all()
    # a longer mask (cached prefix + these tokens) is sliced to its last T columns
    assert torch.equal(layer(h, torch.cat([torch.ones(2, 3, dtype=torch.long), mask], 1)), y)
    with pytest.raises(ValueError, match=r'attention mask must be \(B, L\)'):
        layer(h, mask[:, :3])


@pytest.mark.parametrize('chunks', [(7,), (3, 4), (1,) * 7, (2, 1, 4)])
def test_canon_extend_with_mask_equals_forward_with_mask(chunks):
    """Chunked prefill (any chunk sizes) with the mask equals the whole sequence with the mask."""
    torch.manual_seed(0)
    layer = Canon(5, kernel_size=3, activation=True)
    h = torch.randn(2, 7, 5)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0]])
    outs, cache, start = [], None, 0
    for n in chunks:
        y, cache = layer.extend(h[:, start:start + n], cache, mask[:, :start + n])
        outs.append(y)
        start += n
    assert torch.allclose(torch.cat(outs, 1), layer(h, mask), atol=1e-6)


@pytest.mark.parametrize('name', FAMILIES)
@pytest.mark.parametrize('side', ['left', 'right'])
def test_padded_batch_equals_sequences_one_by_one(name, side):
    torch.manual_seed(0)
    model = zoo.create(name, canon='ABCD').eval()
    seqs = [torch.randint(0, 64, (n,)) for n in (5, 11, 8)]
    tokens, mask = _padded(seqs, side)
    with torch.no_grad():
        out = model(tokens, attention_mask=mask)
        assert torch.isfinite(out).all()
        for i, s in enumerate(seqs):
            assert torch.allclose(out[i][mask[i].bool()], model(s[None])[0], atol=1e-5)
        if side == 'left':  # without the mask the padding does leak in (so the test can fail)
            unmasked = model(tokens)
            assert not torch.allclose(unmasked[0][mask[0].bool()], model(seqs[0][None])[0], atol=1e-3)


@pytest.mark.parametrize('name', FAMILIES)
def test_left_padded_prompt_then_cached_decoding(name):
    """Generation's layout: a left-padded prompt, then tokens one at a time against the caches, the mask growing."""
    torch.manual_seed(0)
    model = zoo.create(name, canon='ABCD').eval()
    seqs = [torch.randint(0, 64, (n,)) for n in (4, 9)]
    tokens, mask = _padded(seqs, 'left')
    new = torch.randint(0, 64, (2, 3))
    cache = model.init_cache()
    with torch.no_grad():
        model(tokens, cache, attention_mask=mask)
        for j in range(3):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
            logits = model(new[:, j:j + 1], cache, attention_mask=mask)[:, -1]
            for i, s in enumerate(seqs):
                ref = model(torch.cat([s, new[i, :j + 1]])[None])[0, -1]
                assert torch.allclose(logits[i], ref, atol=1e-5)


def test_all_ones_mask_is_the_unmasked_model():
    torch.manual_seed(0)
    model = zoo.create('llama_tiny', canon='ABCD').eval()
    tokens = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        assert torch.allclose(model(tokens, attention_mask=torch.ones(2, 10)), model(tokens), atol=1e-6)


def test_bad_attention_mask_is_a_clear_error():
    model = zoo.create('llama_tiny', canon='A')
    tokens = torch.randint(0, 64, (2, 6))
    for bad in (torch.ones(2, 5), torch.ones(3, 6), torch.full((2, 6), 2), torch.ones(2, 6, 1)):
        with pytest.raises(ValueError, match=r'attention_mask must be a \(B, past \+ T\) tensor of 0/1'):
            model(tokens, attention_mask=bad)


@pytest.mark.parametrize('name', FAMILIES)
def test_canon_kernel_and_activation_reach_every_canon_layer(name):
    torch.manual_seed(0)
    model = zoo.create(name, canon='ABCD', canon_kernel=3, canon_activation=True)
    canons = [m for m in model.modules() if type(m) is Canon]
    assert len(canons) == 4
    assert all(c.kernel_size == 3 and c.activation and c.residual for c in canons)
    assert all(c.conv.weight.shape[-1] == 3 for c in canons)
    base = zoo.create(name, canon='ABCD', canon_kernel=3)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in base.parameters())
    base.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 64, (1, 8))
    with torch.no_grad():  # same weights, the SiLU changes the function
        assert not torch.allclose(model(tokens), base(tokens), atol=1e-4)


def test_generate_left_padded_prompts_equals_one_by_one():
    torch.manual_seed(0)
    model = zoo.create('llama_tiny', canon='ABCD').eval()
    seqs = [torch.randint(0, 64, (n,)) for n in (3, 7)]
    tokens, mask = _padded(seqs, 'left')
    for use_cache in (True, False):
        out = model.generate(tokens, 5, use_cache=use_cache, attention_mask=mask)
        for i, s in enumerate(seqs):
            assert torch.equal(out[i, -5:], model.generate(s[None], 5)[0, -5:])
