"""An independent re-statement of the official RaftMLP (okojoalg/raft-mlp ``libs/modules.py``:
``SerialPermutedLevel``, ``PermutedBlock``, ``ChannelBlock``, ``CrossScaleMLPEmbedding``, ``RaftShrink`` /
``RaftExpansion``; ``libs/models.py``: ``RaftMLP`` with ``shortcut=False``), written here from the paper
and a reading of that code, with the official module paths so that its state dict is in the official
layout (``levels.i.fn.0.fc``, ``levels.i.fn.{2+j}.{1,3,5}``, ``heads.0.1``, ``classifier``).

The semantics spelled out (eval mode, trained grid only):
- a token's C channels are indexed (r co): channel = j*(C/r) + co; raft co = {co + j*C/r}.
- vertical sub-block: LN over the token's C channels *taken in (co, r) order* (the official norm rearranges
  to ``(c1 c2)`` = (co r) before ``nn.LayerNorm``), then for every raft co and column w the vector
  v[j*h + y] = LN(x)[y, w, channel(j, co)] goes through Linear(r*h, 2r*h) -> GELU -> Linear; residual.
- horizontal sub-block: the same along rows (vectors of r*w values).
- channel sub-block: LN(C) in natural order -> Linear(C, 4C) -> GELU -> Linear; residual.
- head: LN(C) per token -> mean over tokens -> classifier.
Written with explicit index bookkeeping (gather by a channel index table), not einops patterns.
"""
import torch
import torch.nn.functional as F
from torch import nn


def _mlp(dim, hidden):
    # indices 0 and 3 hold the Linears, as in the official Block.fn (Linear, GELU, Dropout, Linear, Dropout)
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.0), nn.Linear(hidden, dim), nn.Dropout(0.0))


class PermutedSubBlock(nn.Module):
    """Vertical (axis=1) or horizontal (axis=2) raft mixing on (B, H, W, C) tokens, with the official LN."""

    def __init__(self, channels, length, r, axis):
        super().__init__()
        self.r, self.axis = r, axis
        self.norm = nn.Sequential(nn.Identity(), nn.LayerNorm(channels), nn.Identity())  # official norm.1
        self.fn = _mlp(r * length, 2 * r * length)

    def forward(self, x):
        b, h, w, c = x.shape
        r, co_n = self.r, c // self.r
        # the official LN sees channel j*co_n + co at position co*r + j
        order = torch.tensor([j * co_n + co for co in range(co_n) for j in range(r)])
        y = torch.empty_like(x)
        y[..., order] = self.norm[1](x[..., order])
        if self.axis == 2:                               # horizontal: treat rows as columns
            y = y.transpose(1, 2)
        bb, length, other, _ = y.shape
        # vectors: for each (raft co, other position), values [j*length + pos] = y[pos, other, j*co_n + co]
        v = y.reshape(bb, length, other, r, co_n).permute(0, 4, 2, 3, 1).reshape(bb, co_n, other, r * length)
        v = self.fn(v)
        out = v.reshape(bb, co_n, other, r, length).permute(0, 4, 2, 3, 1).reshape(bb, length, other, c)
        if self.axis == 2:
            out = out.transpose(1, 2)
        return x + out


class ChannelSubBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.norm = nn.LayerNorm(channels)
        self.fn = _mlp(channels, 4 * channels)

    def forward(self, x):
        return x + self.fn(self.norm(x))


class CrossScaleMLPEmbedding(nn.Module):
    def __init__(self, cin, cout, kernels):
        super().__init__()
        self.kernels, self.stride = kernels, kernels[0]
        self.fc = nn.Linear(cin * sum(k * k for k in kernels), cout)

    def forward(self, x):  # -> (B, H/p, W/p, C)
        p = self.stride
        feats = [F.unfold(x, k, padding=(k - p) // 2, stride=p) for k in self.kernels]  # (B, cin*k*k, L)
        t = self.fc(torch.cat(feats, 1).transpose(1, 2))
        return t.reshape(x.shape[0], x.shape[2] // p, x.shape[3] // p, -1)


class Level(nn.Module):
    def __init__(self, cin, cout, depth, kernels, grid, r):
        super().__init__()
        blocks = [nn.Sequential(nn.Identity(), PermutedSubBlock(cout, grid, r, 1), nn.Identity(),
                                PermutedSubBlock(cout, grid, r, 2), nn.Identity(), ChannelSubBlock(cout))
                  for _ in range(depth)]
        self.fn = nn.Sequential(CrossScaleMLPEmbedding(cin, cout, kernels), nn.Identity(), *blocks, nn.Identity())

    def forward(self, x):
        t = self.fn[0](x)
        for block in self.fn[2:-1]:
            for sub in block:
                t = sub(t)
        return t.permute(0, 3, 1, 2)


class OfficialRaftMLP(nn.Module):
    def __init__(self, dims=(32, 48, 64, 96), depths=(1, 1, 2, 1), kernels=((4, 8), (2, 4), (2, 4), (2,)),
                 r=2, img_size=32, num_classes=10):
        super().__init__()
        levels, cin, grid = [], 3, img_size
        for d, c, ks in zip(depths, dims, kernels):
            grid //= ks[0]
            levels.append(Level(cin, c, d, ks, grid, r))
            cin = c
        self.levels = nn.ModuleList(levels)
        self.heads = nn.ModuleList([nn.Sequential(nn.Identity(), nn.LayerNorm(dims[-1]))])
        self.classifier = nn.Linear(dims[-1], num_classes)

    def forward(self, x):
        for level in self.levels:
            x = level(x)
        return self.classifier(self.heads[0][1](x.permute(0, 2, 3, 1)).mean((1, 2)))


def RaftMLP(layers, in_channels=3, pretrained_image_size=224, num_classes=1000, token_expansion_factor=2,  # noqa: N802
            channel_expansion_factor=4, dropout=0.0, token_mixing_type='ser_pm', embedding_type='emb_cross_mlp',
            shortcut=False, drop_path_rate=0.0):
    """The re-statement behind the official constructor's signature (``libs/models.py: RaftMLP(layers=[{depth,
    dim, patch_size, raft_size, embedding_kernels}], ...)``), so that ``zoo bench --vs official:`` can be tested
    on it. Only the published configuration is re-stated (eval mode: dropout and drop path do not act)."""
    if (in_channels, token_expansion_factor, channel_expansion_factor, token_mixing_type, embedding_type,
            shortcut) != (3, 2, 4, 'ser_pm', 'emb_cross_mlp', False):
        raise NotImplementedError('the re-statement covers the published cross-scale RaftMLP only')
    (r,) = {layer['raft_size'] for layer in layers}
    return OfficialRaftMLP(dims=[layer['dim'] for layer in layers], depths=[layer['depth'] for layer in layers],
                           kernels=[tuple(layer['embedding_kernels']) for layer in layers], r=r,
                           img_size=pretrained_image_size, num_classes=num_classes)
