"""Transformer in Transformer (TNT) building blocks, and the TNT inner/outer pair as a token mixer.

"Transformer in Transformer", Han et al., NeurIPS 2021, arXiv 2103.00112.
Official code: https://github.com/huawei-noah/CV-Backbones (``tnt_pytorch/tnt.py``).

TNT reads an image as "visual sentences" (patches) made of "visual words" (sub-patches). An
*inner* transformer attends among the words of one sentence (the same weights for every
sentence), a *word-to-sentence* projection folds the words of each sentence into one vector that
is added to the sentence token, and an *outer* transformer attends among the sentences.

- ``TokenAttention``: multi-head self-attention on (B, L, D) tokens (fused q/k/v projection,
  ``F.scaled_dot_product_attention``); used by both transformers of the TNT family.
- ``WordToSentence``: LN(m*c) -> Linear(m*c -> d) -> LN(d), TNT's fusion of m words of width c.
- ``TNTMixer`` (``token_mixer/tnt``, layout ``nchw``): the pair as a MetaFormer token mixer.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ._registry import register
from .onednn import linear

# einops cannot take a torch.fx Proxy: traced as one call (torch.fx.symbolic_trace, create_feature_extractor)
torch.fx.wrap('rearrange')


class TokenAttention(nn.Module):
    """Multi-head self-attention over (B, L, dim) tokens: one ``qkv`` Linear, SDPA, ``proj``.

    TNT's code keeps ``qk`` (dim -> 2 dim) and ``v`` (dim -> dim) as two Linears; one fused
    Linear has the same parameters (rows stacked q, k, v) and runs as one GEMM
    (``zoo.tnt.remap_checkpoint`` concatenates them). Scale ``head_dim ** -0.5``, as in TNT.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = False, attn_drop: float = 0.0,
                 proj_drop: float = 0.0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'attention: dim={dim} must be a multiple of num_heads={num_heads}')
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                num_queries: int | None = None) -> torch.Tensor:
        """(B, L, dim) -> (B, L, dim); with ``num_queries`` = n, only the first n tokens' outputs (B, n, dim):
        the same values, from the queries of those tokens alone (every token still gives keys and values)."""
        if num_queries is None:  # ``linear``: nn.Linear's function, through oneDNN in CPU inference
            q, k, v = rearrange(linear(x, self.qkv), 'b l (three h d) -> three b h l d', three=3, h=self.num_heads)
        else:
            dim, w, bias = x.shape[-1], self.qkv.weight, self.qkv.bias  # weight rows: q, k, v
            q = F.linear(x[:, :num_queries], w[:dim], None if bias is None else bias[:dim])
            kv = F.linear(x, w[dim:], None if bias is None else bias[dim:])
            q = rearrange(q, 'b n (h d) -> b h n d', h=self.num_heads)
            k, v = rearrange(kv, 'b l (two h d) -> two b h l d', two=2, h=self.num_heads)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           dropout_p=self.attn_drop if self.training else 0.0)
        return self.proj_drop(linear(rearrange(x, 'b h l d -> b l (h d)'), self.proj))


class WordToSentence(nn.Module):
    """TNT's fusion of the m words of a sentence into one sentence vector.

    (B, N, m, c) or (B, N, m*c) -> LayerNorm(m*c) -> Linear(m*c -> d) -> LayerNorm(d) -> (B, N, d).
    The stem's projection has a bias, the blocks' has none (official code and timm).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, eps: float = 1e-5):
        super().__init__()
        self.norm1 = nn.LayerNorm(in_features, eps=eps)
        self.proj = nn.Linear(in_features, out_features, bias=bias)
        self.norm2 = nn.LayerNorm(out_features, eps=eps)

    def forward(self, words: torch.Tensor) -> torch.Tensor:
        return self.norm2(self.proj(self.norm1(words.flatten(2))))  # (B, N, m, c) -> (B, N, m*c); 3-d: as it is


@register('token_mixer', 'tnt', layout='nchw', fixed_size=False, example=dict(dim=16, sentence_size=2),
          example_input=(2, 16, 5, 6))
class TNTMixer(nn.Module):
    """TNT's inner/outer transformer pair as a MetaFormer token mixer on NCHW maps.

    Every position of the (B, C, H, W) map is a visual word; ``sentence_size`` x ``sentence_size``
    windows of words are visual sentences (at a MetaFormer stage of stride 4 the default 4x4
    windows are TNT's 16x16-pixel sentences of 16 words). With x the (normed) block input::

        inner = MHSA over the words of each sentence            (TNT's inner transformer)
        s     = WordToSentence(x + inner)                       (word-to-sentence projection, TNT's fuse)
        outer = MHSA over the sentences of the image, on s      (TNT's outer transformer)
        out   = inner + outer broadcast to the words of its sentence

    The MetaFormer block adds the residual and runs the MLP. Since a MetaFormer keeps one token
    stream, the sentence tokens are rebuilt from the words in every block (TNT carries them as a
    second stream); no class token, no position embeddings (the blocks' convolutions give position).

    Grid: the weights depend on ``sentence_size`` only, not on the grid (``fixed_size=False``), so
    any input size works. A grid that is not a multiple of ``sentence_size`` is zero-padded at the
    bottom/right to one and the padded words are masked out of the inner attention (Swin-style
    padding); padded words stay zero in the word-to-sentence projection, like TNT's conv padding.
    """

    def __init__(self, dim: int, sentence_size: int = 4, inner_heads: int = 4, outer_head_dim: int = 32,
                 qkv_bias: bool = False, attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        if sentence_size < 1:
            raise ValueError(f'tnt mixer: sentence_size must be >= 1, got {sentence_size}')
        self.sentence_size = sentence_size
        words = sentence_size * sentence_size
        # Widths that the head counts do not divide fall back to one head.
        inner_heads = inner_heads if dim % inner_heads == 0 else 1
        head_dim = min(outer_head_dim, dim)
        outer_heads = dim // head_dim if dim % head_dim == 0 else 1
        self.inner_attn = TokenAttention(dim, inner_heads, qkv_bias, attn_drop, proj_drop)
        self.word_to_sentence = WordToSentence(words * dim, dim)
        self.outer_attn = TokenAttention(dim, outer_heads, qkv_bias, attn_drop, proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        p = self.sentence_size
        ph, pw = (-h) % p, (-w) % p
        mask = keep = None
        if ph or pw:
            x = F.pad(x, (0, pw, 0, ph))
            valid = F.pad(x.new_ones(1, 1, h, w, dtype=torch.bool), (0, pw, 0, ph))
            valid = rearrange(valid, '1 1 (gh p1) (gw p2) -> (gh gw) (p1 p2)', p1=p, p2=p).repeat(b, 1)  # (B*N, m)
            mask = valid[:, None, None, :]   # (B*N, 1, 1, m): padded words are no keys
            keep = valid[:, :, None]         # (B*N, m, 1): and stay zero in the projection
        gh, gw = x.shape[-2] // p, x.shape[-1] // p
        words = rearrange(x, 'b c (gh p1) (gw p2) -> (b gh gw) (p1 p2) c', p1=p, p2=p)
        inner = self.inner_attn(words, attn_mask=mask)                        # (B*N, p*p, C)
        if keep is not None:
            inner = inner * keep
        sentences = self.word_to_sentence(rearrange(words + inner, '(b n) m c -> b n (m c)', b=b))  # (B, N, C)
        outer = self.outer_attn(sentences)                                    # (B, N, C)
        out = rearrange(inner, '(b n) m c -> b n m c', b=b) + outer.unsqueeze(2)
        out = rearrange(out, 'b (gh gw) (p1 p2) c -> b c (gh p1) (gw p2)', gh=gh, gw=gw, p1=p, p2=p)
        return out[:, :, :h, :w] if (ph or pw) else out
