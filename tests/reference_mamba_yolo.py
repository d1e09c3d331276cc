"""An independent re-statement of the official Mamba-YOLO detector, for the tests (CI has no network).

Written here from a reading of HZAI-ZJNU/Mamba-YOLO (``ultralytics/nn/modules/mamba_yolo.py``: SS2D, RGBlock,
LSBlock, XSSBlock, VSSBlock, SimpleStem, VisionClueMerge; ``common_utils_mbyolo.py``: LayerNorm2d, CrossScan,
CrossMerge, cross_selective_scan; the shipped ``Mamba-YOLO-{T,B,L}.yaml``) and of the ultralytics modules it
uses (Conv, SPPF, Concat, Detect, DFL, ``DetectionModel``'s layer list). Nothing is imported or copied from
that code (AGPL-3.0). Module and attribute names are the official ones, so ``OfficialMambaYOLO().state_dict()``
is in the official layout (``model.<i>.``), keys and shapes. The selective scan is a plain loop over positions.

Checked on the development machine against the real official ``DetectionModel`` (see tests/test_mamba_yolo.py).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm2d(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _scan(u, delta, A, Bs, Cs, D, bias):
    """Selective scan, one position at a time: u, delta (B, G*d, L); A (G*d, N); Bs, Cs (B, G, N, L)."""
    b, gd, length = u.shape
    groups = Bs.shape[1]
    delta = F.softplus(delta + bias[:, None])
    Bs = Bs.repeat_interleave(gd // groups, 1)                       # (B, G*d, N, L)
    Cs = Cs.repeat_interleave(gd // groups, 1)
    h = u.new_zeros(b, gd, A.shape[1])
    ys = []
    for t in range(length):
        h = torch.exp(delta[:, :, t, None] * A) * h + delta[:, :, t, None] * Bs[..., t] * u[:, :, t, None]
        ys.append((h * Cs[..., t]).sum(-1) + D * u[:, :, t])
    return torch.stack(ys, -1)


class SS2D(nn.Module):
    def __init__(self, d_model, d_state=16):
        super().__init__()
        d = 2 * d_model
        self.dt_rank, self.d_state, self.K = math.ceil(d_model / 16), d_state, 4
        self.out_norm = nn.LayerNorm(d)
        self.in_proj = nn.Conv2d(d_model, 2 * d, 1, bias=False)
        self.act = nn.GELU()
        self.conv2d = nn.Conv2d(d, d, 3, padding=1, groups=d)
        self.x_proj_weight = nn.Parameter(torch.randn(4, self.dt_rank + 2 * d_state, d))
        self.out_proj = nn.Conv2d(d, d_model, 1, bias=False)
        self.dropout = nn.Identity()
        self.Ds = nn.Parameter(torch.ones(4 * d))
        self.A_logs = nn.Parameter(torch.zeros(4 * d, d_state))
        self.dt_projs_weight = nn.Parameter(torch.randn(4, d, self.dt_rank))
        self.dt_projs_bias = nn.Parameter(torch.randn(4, d))

    def forward(self, x):
        x, z = self.in_proj(x).chunk(2, 1)
        x = self.act(self.conv2d(x))
        b, d, h, w = x.shape
        rows, cols = x.flatten(2), x.transpose(2, 3).flatten(2)                  # (B, D, L) each
        xs = torch.stack([rows, cols, rows.flip(-1), cols.flip(-1)], 1)           # (B, 4, D, L)
        dbl = torch.einsum('bkdl,kcd->bkcl', xs, self.x_proj_weight)
        dts, Bs, Cs = dbl.split([self.dt_rank, self.d_state, self.d_state], 2)
        dts = torch.einsum('bkrl,kdr->bkdl', dts, self.dt_projs_weight)
        ys = _scan(xs.reshape(b, 4 * d, h * w), dts.reshape(b, 4 * d, h * w), -self.A_logs.exp(), Bs, Cs, self.Ds,
                   self.dt_projs_bias.reshape(-1)).view(b, 4, d, h * w)
        ys = ys[:, :2] + ys[:, 2:].flip(-1)                                      # undo the reversals
        y = ys[:, 0] + ys[:, 1].view(b, d, w, h).transpose(2, 3).reshape(b, d, h * w)  # undo the transpose
        y = self.out_norm(y.transpose(1, 2)).view(b, h, w, d).permute(0, 3, 1, 2)
        return self.dropout(self.out_proj(y * self.act(z)))


class RGBlock(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        hidden = int(2 * hidden / 3)
        self.fc1 = nn.Conv2d(dim, 2 * hidden, 1)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Conv2d(hidden, dim, 1)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        x, v = self.fc1(x).chunk(2, 1)
        return self.fc2(self.act(self.dwconv(x) + x) * v)


class LSBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc1 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm = nn.BatchNorm2d(dim, eps=1e-3, momentum=0.03)
        self.fc2 = nn.Conv2d(dim, dim, 1)
        self.act = nn.GELU()
        self.fc3 = nn.Conv2d(dim, dim, 1)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        return x + self.fc3(self.act(self.fc2(self.norm(self.fc1(x)))))


def _bn(c):
    return nn.BatchNorm2d(c, eps=1e-3, momentum=0.03)


class VSSBlock(nn.Module):
    def __init__(self, c_in, c):
        super().__init__()
        self.proj_conv = nn.Sequential(nn.Conv2d(c_in, c, 1), _bn(c), nn.SiLU())
        self.norm = LayerNorm2d(c)
        self.op = SS2D(c)
        self.drop_path = nn.Identity()
        self.lsblock = LSBlock(c)
        self.norm2 = LayerNorm2d(c)
        self.mlp = RGBlock(c, 4 * c)

    def forward(self, x):
        x = self.proj_conv(x)
        x = x + self.op(self.norm(self.lsblock(x)))
        return x + self.mlp(self.norm2(x))


class XSSBlock(nn.Module):
    def __init__(self, c_in, c, n=1):
        super().__init__()
        self.in_proj = nn.Sequential(nn.Conv2d(c_in, c, 1, bias=False), _bn(c), nn.SiLU()) if c_in != c \
            else nn.Identity()
        self.norm = LayerNorm2d(c)
        self.ss2d = nn.Sequential(*(SS2D(c) for _ in range(n)))
        self.drop_path = nn.Identity()
        self.lsblock = LSBlock(c)
        self.norm2 = LayerNorm2d(c)
        self.mlp = RGBlock(c, 4 * c)

    def forward(self, x):
        x = self.in_proj(x)
        x = x + self.ss2d(self.norm(self.lsblock(x)))
        return x + self.mlp(self.norm2(x))


class SimpleStem(nn.Module):
    def __init__(self, c_in, c):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(c_in, c // 2, 3, 2, 1, bias=False), _bn(c // 2), nn.GELU(),
                                  nn.Conv2d(c // 2, c, 3, 2, 1, bias=False), _bn(c), nn.SiLU())

    def forward(self, x):
        return self.conv(x)


class VisionClueMerge(nn.Module):
    def __init__(self, c_in, c):
        super().__init__()
        self.pw_linear = nn.Sequential(nn.Conv2d(4 * c_in, c, 1), _bn(c), nn.SiLU())

    def forward(self, x):
        parts = [x[..., i::2, j::2] for j in (0, 1) for i in (0, 1)]  # (0,0), (1,0), (0,1), (1,1)
        return self.pw_linear(torch.cat(parts, 1))


class Conv(nn.Module):
    def __init__(self, c_in, c, k=1, s=1):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c, k, s, k // 2, bias=False)
        self.bn = _bn(c)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class SPPF(nn.Module):
    def __init__(self, c_in, c, k=5):
        super().__init__()
        self.cv1 = Conv(c_in, c_in // 2)
        self.cv2 = Conv(2 * c_in, c)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x):
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class Concat(nn.Module):
    def forward(self, xs):
        return torch.cat(xs, 1)


class DFL(nn.Module):
    def __init__(self, bins=16):
        super().__init__()
        self.conv = nn.Conv2d(bins, 1, 1, bias=False).requires_grad_(False)
        self.conv.weight.data[:] = torch.arange(bins, dtype=torch.float).view(1, bins, 1, 1)
        self.c1 = bins

    def forward(self, x):
        b, _, a = x.shape
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


class Detect(nn.Module):
    """YOLOv8's head: eval mode returns (y, maps) with y = (xywh boxes in pixels, class sigmoids)."""

    def __init__(self, nc, ch, strides=(8, 16, 32)):
        super().__init__()
        self.nc, self.reg_max = nc, 16
        c2, c3 = max(16, ch[0] // 4, 64), max(ch[0], min(nc, 100))
        self.cv2 = nn.ModuleList(nn.Sequential(Conv(c, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 64, 1)) for c in ch)
        self.cv3 = nn.ModuleList(nn.Sequential(Conv(c, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1)) for c in ch)
        self.dfl = DFL(16)
        self.stride = torch.tensor(strides, dtype=torch.float)

    def forward(self, xs):
        maps = [torch.cat((a(x), b(x)), 1) for x, a, b in zip(xs, self.cv2, self.cv3)]
        if self.training:
            return maps
        points, strides = [], []
        for m, s in zip(maps, self.stride):
            h, w = m.shape[-2:]
            yy, xx = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing='ij')
            points.append(torch.stack((xx, yy), -1).view(-1, 2))
            strides.append(torch.full((h * w, 1), float(s)))
        anchors, strides = torch.cat(points).T[None], torch.cat(strides).T                 # (1, 2, A), (1, A)
        flat = torch.cat([m.flatten(2) for m in maps], 2)
        box, cls = flat.split((64, self.nc), 1)
        lt, rb = self.dfl(box).chunk(2, 1)
        x1y1, x2y2 = anchors - lt, anchors + rb
        xywh = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * strides
        return torch.cat((xywh, cls.sigmoid()), 1), maps


def official_layers(widths, depths, neck_n=1, nc=80):
    """The shipped yamls' layer list at the given widths (stem/stage widths) and depths:
    [(from, module)], VSSBlock repeats as an nn.Sequential when more than one (ultralytics' parse_model)."""
    w0, w1, w2, w3 = widths

    def vss(c, n):
        return VSSBlock(c, c) if n == 1 else nn.Sequential(*(VSSBlock(c, c) for _ in range(n)))

    return [(-1, SimpleStem(3, w0)), (-1, vss(w0, depths[0])), (-1, VisionClueMerge(w0, w1)),
            (-1, vss(w1, depths[1])), (-1, VisionClueMerge(w1, w2)), (-1, vss(w2, depths[2])),
            (-1, VisionClueMerge(w2, w3)), (-1, vss(w3, depths[3])), (-1, SPPF(w3, w3)),
            (-1, nn.Upsample(None, 2, 'nearest')), ([-1, 5], Concat()), (-1, XSSBlock(w3 + w2, w2, neck_n)),
            (-1, nn.Upsample(None, 2, 'nearest')), ([-1, 3], Concat()), (-1, XSSBlock(w2 + w1, w1, neck_n)),
            (-1, Conv(w1, w1, 3, 2)), ([-1, 11], Concat()), (-1, XSSBlock(w1 + w2, w2, neck_n)),
            (-1, Conv(w2, w2, 3, 2)), ([-1, 8], Concat()), (-1, XSSBlock(w2 + w3, w3, neck_n)),
            ([14, 17, 20], Detect(nc, (w1, w2, w3)))]


class DetectionModel(nn.Module):
    """``model`` is the layer list; each layer reads the previous output or the saved outputs it names."""

    def __init__(self, widths=(32, 64, 128, 256), depths=(1, 1, 3, 1), neck_n=1, nc=80):
        super().__init__()
        layers = official_layers(widths, depths, neck_n, nc)
        self.model = nn.Sequential(*(m for _, m in layers))
        self.sources = [f for f, _ in layers]

    def forward(self, x):
        outs = []
        for src, m in zip(self.sources, self.model):
            if src != -1:
                x = [outs[-1] if i == -1 else outs[i] for i in src] if isinstance(src, list) else outs[src]
            x = m(x)
            outs.append(x)
        return x


CONFIGS = {'t': ((32, 64, 128, 256), (1, 1, 3, 1), 1), 'b': ((64, 128, 256, 512), (1, 1, 3, 1), 1),
           'l': ((96, 192, 384, 576), (2, 2, 6, 2), 2)}  # (widths, VSS depths, XSS n) of the shipped yamls
