"""An independent re-statement of the official TNT block (huawei-noah/CV-Backbones ``tnt_pytorch/tnt.py``:
``Attention``, ``Mlp``, ``Block.forward`` with ``se=0``), written here from the paper (Han et al., NeurIPS 2021)
and a reading of that code, with the official module names (its state dict is in the official layout).

Attention as in the official code: separate ``qk`` (dim -> 2 dim) and ``v`` (dim -> dim) Linears, heads split
as (2, heads, head_dim) for q/k, scale head_dim ** -0.5, explicit softmax (no SDPA). Block (eval mode):
words += attn(LN(words)); words += mlp(LN(words)); sentences[:, 1:] += LN(proj(LN(words as (B, N, m*c))))
(the class token gets nothing, no drop path on that term); sentences += attn(LN(.)); sentences += mlp(LN(.)).
"""
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qk = nn.Linear(dim, 2 * dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        hd = d // self.heads
        q, k = self.qk(x).view(b, n, 2, self.heads, hd).unbind(2)           # (b, n, heads, hd) each
        v = self.v(x).view(b, n, self.heads, hd)
        att = torch.einsum('bqhd,bkhd->bhqk', q, k).mul(hd ** -0.5).softmax(-1)
        return self.proj(torch.einsum('bhqk,bkhd->bqhd', att, v).reshape(b, n, d))


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class OfficialTNTBlock(nn.Module):
    def __init__(self, outer_dim, inner_dim, outer_heads, inner_heads, num_words, mlp_ratio=4.0):
        super().__init__()
        self.inner_norm1 = nn.LayerNorm(inner_dim)
        self.inner_attn = Attention(inner_dim, inner_heads)
        self.inner_norm2 = nn.LayerNorm(inner_dim)
        self.inner_mlp = Mlp(inner_dim, int(inner_dim * mlp_ratio))
        self.proj_norm1 = nn.LayerNorm(num_words * inner_dim)
        self.proj = nn.Linear(num_words * inner_dim, outer_dim, bias=False)
        self.proj_norm2 = nn.LayerNorm(outer_dim)
        self.outer_norm1 = nn.LayerNorm(outer_dim)
        self.outer_attn = Attention(outer_dim, outer_heads)
        self.outer_norm2 = nn.LayerNorm(outer_dim)
        self.outer_mlp = Mlp(outer_dim, int(outer_dim * mlp_ratio))

    def forward(self, words, sentences):
        words = words + self.inner_attn(self.inner_norm1(words))
        words = words + self.inner_mlp(self.inner_norm2(words))
        b, n1, _ = sentences.shape
        fused = self.proj_norm2(self.proj(self.proj_norm1(words.reshape(b, n1 - 1, -1))))
        sentences = torch.cat([sentences[:, :1], sentences[:, 1:] + fused], 1)
        sentences = sentences + self.outer_attn(self.outer_norm1(sentences))
        return words, sentences + self.outer_mlp(self.outer_norm2(sentences))
