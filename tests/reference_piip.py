"""An independent re-statement of the official PIIP forward, for the tests (CI has no network).

Written here from a reading of OpenGVLab/PIIP: the classifier (``classification/piip_3branch.py``,
``piip_modules.py``, ``deit.py``'s ``vit_models`` / ``Layer_scale_init_Block``, ``intern_vit_6b.py``'s
``InternViT6B``, the branch type the AugReg configs use) and the Mask R-CNN backbones
(``mmdetection/mmdet/models/backbones/piip_{3,4}branch.py``, ``deit.py``'s ``WindowedFlashAttention``,
``piip_modules.py``), with Deformable DETR's ``MSDeformAttn`` on the ops' PyTorch core (one ``grid_sample``).
Nothing is copied. Module and parameter names are the official ones, so ``state_dict()`` is in the official
layout. N branches in one class (the official code has one class per branch count; the units run from the
high-resolution pair inward in all of them). Deliberately plain: explicit softmax attention, a loop over
windows, reference points from ``linspace``.

Two things are re-stated as the released configs run them, not as the repository's fallbacks: window attention
pads the token grid BEFORE the qkv projection (the flash path; the non-flash ``WindowedAttention`` pads after),
and it runs in the model's dtype (the flash path casts qkv to float16 first).
Checked on the development machine against the real official modules (see tests/test_piip.py).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _ln(d):
    return nn.LayerNorm(d, eps=1e-6)


class PatchEmbed(nn.Module):
    def __init__(self, dim, patch=16):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, patch, patch)

    def forward(self, x):
        x = self.proj(x)
        return x.flatten(2).transpose(1, 2), x.shape[2], x.shape[3]


class Attention(nn.Module):
    """Global attention, or window attention (zero-padded grid, windows attend alone, crop, then proj)."""

    def __init__(self, dim, heads, window=0):
        super().__init__()
        self.heads, self.window = heads, window
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def _attend(self, x):
        n, length, c = x.shape
        q, k, v = self.qkv(x).view(n, length, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = ((q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1)).softmax(-1)
        return (a @ v).transpose(1, 2).reshape(n, length, c)

    def forward(self, x, h, w):
        if not self.window:
            return self.proj(self._attend(x))
        b, _, c = x.shape
        s = self.window
        hp, wp = math.ceil(h / s) * s, math.ceil(w / s) * s
        grid = F.pad(x.view(b, h, w, c), (0, 0, 0, wp - w, 0, hp - h))
        out = torch.empty_like(grid)
        for i in range(0, hp, s):
            for j in range(0, wp, s):
                out[:, i:i + s, j:j + s] = self._attend(grid[:, i:i + s, j:j + s].reshape(b, s * s, c)).view(b, s, s, c)
        return self.proj(out[:, :h, :w].reshape(b, h * w, c))


class Mlp(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """DeiT's ``Layer_scale_init_Block`` (``gamma_1/2``) or, ``layer_scale=False``, the AugReg branch's block."""

    def __init__(self, dim, heads, window=0, layer_scale=True):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = _ln(dim), Attention(dim, heads, window), _ln(dim), Mlp(dim)
        if layer_scale:
            self.gamma_1, self.gamma_2 = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.ones(dim))
        self.layer_scale = layer_scale

    def forward(self, x, h, w):
        g1, g2 = (self.gamma_1, self.gamma_2) if self.layer_scale else (1.0, 1.0)
        x = x + g1 * self.attn(self.norm1(x), h, w)
        return x + g2 * self.mlp(self.norm2(x))


class Branch(nn.Module):
    """One ViT branch. ``kind``: 'deit' (position grid without class slot; classification: at the branch's own
    size) or 'augreg' (class slot kept in ``pos_embed``, which PIIP never adds). ``pos_size``: the stored grid
    (detection: the 224-px pretraining grid, resized bicubically in every forward)."""

    def __init__(self, kind, dim, depth, heads, pos_size, classes=0, window=0):
        super().__init__()
        self.kind, self.grid = kind, pos_size // 16
        self.patch_embed = PatchEmbed(dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.grid ** 2 + (kind == 'augreg'), dim))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if classes else None
        self.blocks = nn.ModuleList(Block(dim, heads, window, kind == 'deit') for _ in range(depth))
        if classes:
            self.norm, self.head = _ln(dim), nn.Linear(dim, classes)

    def embed(self, x):
        x, h, w = self.patch_embed(x)
        pos = self.pos_embed[:, 1:] if self.kind == 'augreg' else self.pos_embed
        if (h, w) != (self.grid, self.grid):
            pos = pos.reshape(1, self.grid, self.grid, -1).permute(0, 3, 1, 2)
            pos = F.interpolate(pos.float(), size=(h, w), mode='bicubic', align_corners=False).flatten(2).transpose(1, 2)
        return x + pos, h, w


class MSDeformAttn(nn.Module):
    """Deformable DETR's attention at one level: ``heads`` heads, ``points`` samples each, value width D * ratio."""

    def __init__(self, dim, heads=16, points=4, ratio=0.5):
        super().__init__()
        self.heads, self.points = heads, points
        self.sampling_offsets = nn.Linear(dim, heads * points * 2)
        self.attention_weights = nn.Linear(dim, heads * points)
        self.value_proj = nn.Linear(dim, int(dim * ratio))
        self.output_proj = nn.Linear(int(dim * ratio), dim)

    def forward(self, query, ref, value, hv, wv):
        b, nq, _ = query.shape
        m, p = self.heads, self.points
        v = self.value_proj(value)                                                # (B, Hv*Wv, Dv)
        dh = v.shape[-1] // m
        v = v.transpose(1, 2).reshape(b * m, dh, hv, wv)
        offsets = self.sampling_offsets(query).view(b, nq, m, p, 2)
        weights = self.attention_weights(query).view(b, nq, m, p).softmax(-1)
        loc = ref[:, :, None, None, :] + offsets / torch.tensor([wv, hv], dtype=query.dtype)  # (x, y) in [0, 1]
        grid = (2 * loc - 1).transpose(1, 2).reshape(b * m, nq, p, 2)
        sampled = F.grid_sample(v, grid, mode='bilinear', padding_mode='zeros', align_corners=False)  # (BM, dh, Nq, P)
        out = (sampled * weights.transpose(1, 2).reshape(b * m, 1, nq, p)).sum(-1)   # (BM, dh, Nq)
        return self.output_proj(out.view(b, m * dh, nq).transpose(1, 2))


def reference_points(h, w):
    """Cell centres of an h x w grid, normalised to [0, 1], (x, y): (1, h*w, 2)."""
    ys, xs = torch.meshgrid(torch.linspace(0.5, h - 0.5, h) / h, torch.linspace(0.5, w - 0.5, w) / w, indexing='ij')
    return torch.stack((xs.reshape(-1), ys.reshape(-1)), -1)[None]


class DWConv(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)

    def forward(self, x, h, w):
        b, n, c = x.shape
        return self.dwconv(x.transpose(1, 2).reshape(b, c, h, w)).flatten(2).transpose(1, 2)


class ConvFFN(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.dwconv, self.act, self.fc2 = nn.Linear(dim, hidden), DWConv(hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x, h, w):
        return self.fc2(self.act(self.dwconv(self.fc1(x), h, w)))


class Injector(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.query_norm, self.feat_norm = _ln(dim), _ln(dim)
        self.attn = MSDeformAttn(dim)
        self.ca_gamma, self.cffn_gamma = nn.Parameter(torch.zeros(dim)), nn.Parameter(torch.zeros(dim))
        self.ffn, self.ffn_norm = ConvFFN(dim, dim // 4), _ln(dim)

    def forward(self, q, hq, wq, feat, hv, wv):
        q = q + self.ca_gamma * self.attn(self.query_norm(q), reference_points(hq, wq), self.feat_norm(feat), hv, wv)
        return q + self.cffn_gamma * self.ffn(self.ffn_norm(q), hq, wq)


class BidirectionalInteractionUnit(nn.Module):
    def __init__(self, d1, d2):
        super().__init__()
        self.branch2to1_proj, self.branch1to2_proj = nn.Linear(d2, d1), nn.Linear(d1, d2)
        self.branch2to1_injector, self.branch1to2_injector = Injector(d1), Injector(d2)

    def forward(self, x1, g1, x2, g2):
        to2, to1 = self.branch1to2_proj(x1), self.branch2to1_proj(x2)   # both from the tensors before the unit
        return self.branch2to1_injector(x1, *g1, to1, *g2), self.branch1to2_injector(x2, *g2, to2, *g1)


class InteractionBlock(nn.Module):
    def __init__(self, dims):
        super().__init__()
        for i in range(len(dims) - 1):
            self.add_module(f'interaction_units_{i + 1}{i + 2}', BidirectionalInteractionUnit(dims[i], dims[i + 1]))
        self.n = len(dims)

    def forward(self, xs, grids):
        for i in reversed(range(self.n - 1)):  # the high-resolution pair first
            unit = getattr(self, f'interaction_units_{i + 1}{i + 2}')
            xs[i], xs[i + 1] = unit(xs[i], grids[i], xs[i + 1], grids[i + 1])
        return xs


class PIIP(nn.Module):
    """``branches``: per branch (kind, dim, depth, heads, size). ``classes`` > 0: the classifier (class tokens,
    separate heads reading ``norm(x)[:, 0]``, logits averaged; position grids at each branch's size);
    ``classes=0``: the detection backbone (no class tokens, 224-px position grids, ``window`` attention, branch
    merges and the simple pyramid). 12-layer branches interact after every block, 24-layer ones every second."""

    def __init__(self, branches, classes=1000, window=0, interactions=12):
        super().__init__()
        self.sizes = [b[4] for b in branches]
        self.steps = [[list(range(i * (b[2] // interactions), (i + 1) * (b[2] // interactions)))
                       for i in range(interactions)] for b in branches]
        for i, (kind, dim, depth, heads, size) in enumerate(branches):
            self.add_module(f'branch{i + 1}', Branch(kind, dim, depth, heads, size if classes else 224, classes,
                                                     0 if classes else window))
        dims = [b[1] for b in branches]
        self.interactions = nn.Sequential(*(InteractionBlock(dims) for _ in range(interactions)))
        self.classes = classes
        if not classes:
            d1 = dims[0]
            for i, d in enumerate(dims):
                self.register_parameter(f'w{i + 1}', nn.Parameter(torch.tensor(1.0)))
                self.add_module(f'merge_branch{i + 1}', nn.Sequential(
                    nn.Conv2d(d, d1, 3, 1, 1, bias=False), nn.GroupNorm(32, d1), nn.ReLU(),
                    nn.Conv2d(d1, d1, 3, 1, 1, bias=False), nn.GroupNorm(32, d1), nn.ReLU()))
            self.fpn1 = nn.Sequential(nn.ConvTranspose2d(d1, d1, 2, 2), nn.GroupNorm(32, d1), nn.GELU(),
                                      nn.ConvTranspose2d(d1, d1, 2, 2))
            self.fpn2 = nn.Sequential(nn.ConvTranspose2d(d1, d1, 2, 2))
            self.fpn3 = nn.Sequential(nn.Identity())
            self.fpn4 = nn.Sequential(nn.MaxPool2d(2, 2))

    def window(self, size: int) -> None:
        """Set the window of every block (the official configs set it per block; one size here)."""
        for m in self.modules():
            if isinstance(m, Attention):
                m.window = size

    def forward(self, x):
        branches = [getattr(self, f'branch{i + 1}') for i in range(len(self.sizes))]
        xs, grids, clss = [], [], []
        for br, size in zip(branches, self.sizes):
            scale = size / self.sizes[-1]
            xi = F.interpolate(x, scale_factor=scale, mode='bilinear', align_corners=False) if scale < 1 else x
            t, h, w = br.embed(xi)
            xs.append(t)
            grids.append((h, w))
            clss.append(br.cls_token.expand(x.shape[0], -1, -1) if br.cls_token is not None else None)
        for step, block in enumerate(self.interactions):
            for i, br in enumerate(branches):
                seq = xs[i] if clss[i] is None else torch.cat([clss[i], xs[i]], 1)
                for j in self.steps[i][step]:
                    seq = br.blocks[j](seq, *grids[i])
                xs[i], clss[i] = (seq, None) if clss[i] is None else (seq[:, 1:], seq[:, :1])
            xs = block(xs, grids)
        if self.classes:
            return torch.stack([br.head(br.norm(t)[:, 0]) for br, t in zip(branches, xs)]).mean(0)
        out = 0
        for i, (t, (h, w)) in enumerate(zip(xs, grids)):
            f = getattr(self, f'merge_branch{i + 1}')(t.transpose(1, 2).reshape(t.shape[0], -1, h, w))
            if (h, w) != grids[-1]:
                f = F.interpolate(f, size=grids[-1], mode='bilinear', align_corners=False)
            out = out + f * getattr(self, f'w{i + 1}')
        return [self.fpn1(out), self.fpn2(out), self.fpn3(out), self.fpn4(out)]


_T, _S, _B, _L = (192, 12, 3), (384, 12, 6), (768, 12, 12), (1024, 24, 16)
# The released configs, (kind, dim, depth, heads, size) per branch, branch1 = the widest model on the smallest image.
CONFIGS = {
    'tsb': [('deit', *_B, 128), ('deit', *_S, 192), ('deit', *_T, 368)],
    'sbl': [('augreg', *_L, 128), ('augreg', *_B, 192), ('augreg', *_S, 384)],
    'tsb_det': [('deit', *_B, 448), ('deit', *_S, 896), ('deit', *_T, 1120)],
    'sbl_det': [('deit', *_L, 448), ('deit', *_B, 672), ('deit', *_S, 1120)],
    # piip_4branch.py builds branch4 with branch3's settings: the released TSBL has two ViT-S branches
    'tsbl_det': [('deit', *_L, 448), ('deit', *_B, 672), ('deit', *_S, 896), ('deit', *_S, 1344)],
}
WINDOWS = {'tsb_det': 14, 'sbl_det': 28, 'tsbl_det': 28}
