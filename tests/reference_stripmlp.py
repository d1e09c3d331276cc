"""An independent re-statement of the official Strip-MLP (Med-Process/Strip_MLP ``models/strip_mlp.py``:
``StripMLP_Block.forward`` / ``.strip_mlp``, ``TokenMixing``, ``ChannelMixing``, ``GRN``, ``BasicBlock``,
``StripMLPNet``), written here from the paper and a reading of that code, with the official module names
so that its state dict is in the official layout (what ``StripMLP.remap_checkpoint`` must load).

Deliberately different in technique from zoo's ``layers/strip.py``: the strip MLP layers are computed
with explicit shifted views and einsum (not a grouped conv over a rearranged map), channel groups are
indexed by hand, and the official semantics are spelled out step by step:

- CGSMM on x (N, C', s, s), C' = C/2, p = 2 if C % 80 == 0 else 4, g = C'/p, channel = c1*g + c2:
  ``xh = proj_h(x + pos_h)``; ``y = GELU(BN(fuse_h([xh, x]))) + pos_w``; ``out = fuse_w([x, proj_w(y)])``.
  The official code never reassigns x, so both fuses take the module input without any bias.
- proj_h: out[c, h, o] = b[c2, o] + sum_{t in -1,0,1} sum_i W[c2*s + o, i, 0, t+1] * in[c, h+t, i]
  (mixes the s positions of a row, reading rows h-1, h, h+1); proj_w the same on the transposed map.
- LSMM: a = fc_h(x) (3x7 depthwise), b = fc_w(x) (7x3); att = reweight(GAP(a + b + x)) viewed as (C', 3),
  softmax over the 3; out = b*att0 + a*att1 + x*att2.
"""
import torch
import torch.nn.functional as F
from torch import nn


def strip_mix_rows(x, weight, bias, g):
    """The official proj_h on (N, C', s, s) by hand: each row mixed by an (s x s) map per tap and c2."""
    n, c, s, _ = x.shape
    w = weight.view(g, s, s, 3)                        # (c2, out pos, in pos, tap)
    xp = F.pad(x, (0, 0, 1, 1))                        # zero rows above and below
    taps = torch.stack([xp[:, :, t:t + s, :] for t in range(3)], dim=-1)  # (N, C', s rows, s in, 3)
    c2 = torch.arange(c) % g                           # the within-group index of every channel
    out = torch.einsum('nchit,coit->ncho', taps, w[c2])
    return out + bias.view(g, s)[c2][None, :, None, :]


class RelativePosition(nn.Module):
    def __init__(self, channels, size):
        super().__init__()
        self.size = size
        self.embeddings_table = nn.Parameter(torch.randn(2 * size + 1, channels) * 0.02)

    def forward(self):
        s = self.size
        bias = torch.empty(self.embeddings_table.shape[1], s, s)
        for q in range(s):
            for k in range(s):
                bias[:, q, k] = self.embeddings_table[k - q + s]
        return bias[None]                              # (1, C', s, s)


class Mlp(nn.Module):
    def __init__(self, cin, hidden, cout):
        super().__init__()
        self.fc1 = nn.Conv2d(cin, hidden, 1)
        self.act = nn.GELU()
        self.fc2 = nn.Conv2d(hidden, cout, 1)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class StripMLP_Block(nn.Module):  # noqa: N801 (the official name, for the official key layout)
    def __init__(self, channels, size):
        super().__init__()
        half = channels // 2
        p = 2 if channels % 80 == 0 else 4
        self.g = half // p
        self.mlp = nn.Sequential(nn.Conv2d(channels, channels, 1), nn.BatchNorm2d(channels), nn.GELU())
        self.BN = nn.BatchNorm2d(half)
        self.proj_h = nn.Conv2d(size * self.g, self.g * size, (1, 3), padding=(0, 1), groups=self.g)
        self.proj_w = nn.Conv2d(size * self.g, self.g * size, (1, 3), padding=(0, 1), groups=self.g)
        self.fuse_h = nn.Conv2d(channels, half, 1, bias=False)
        self.fuse_w = nn.Conv2d(channels, half, 1, bias=False)
        self.fc_h = nn.Conv2d(half, half, (3, 7), padding=(1, 3), groups=half, bias=False)
        self.fc_w = nn.Conv2d(half, half, (7, 3), padding=(3, 1), groups=half, bias=False)
        self.reweight = Mlp(half, half // 2, 3 * half)
        self.fuse = nn.Conv2d(channels, channels, 1, bias=False)
        self.relate_pos_h = RelativePosition(half, size)
        self.relate_pos_w = RelativePosition(half, size)

    def cgsmm(self, x):
        xh = strip_mix_rows(x + self.relate_pos_h(), self.proj_h.weight, self.proj_h.bias, self.g)
        y = F.gelu(self.BN(self.fuse_h(torch.cat([xh, x], 1)))) + self.relate_pos_w()
        # proj_w mixes the positions of each column: the row mixing on the transposed map
        xw = strip_mix_rows(y.transpose(2, 3), self.proj_w.weight, self.proj_w.bias, self.g).transpose(2, 3)
        return self.fuse_w(torch.cat([x, xw], 1))

    def lsmm(self, x):
        a, b = self.fc_h(x), self.fc_w(x)
        att = self.reweight((a + b + x).mean((2, 3), keepdim=True))          # (N, 3C', 1, 1)
        att = att.view(x.shape[0], x.shape[1], 3).softmax(-1)                 # (N, C', 3)
        return b * att[..., 0, None, None] + a * att[..., 1, None, None] + x * att[..., 2, None, None]

    def forward(self, x):
        x = self.mlp(x)
        half = x.shape[1] // 2
        return self.fuse(torch.cat([self.cgsmm(x[:, :half]), self.lsmm(x[:, half:])], 1))


class BN_Activ_Conv(nn.Module):  # noqa: N801
    def __init__(self, channels):
        super().__init__()
        self.BN = nn.BatchNorm2d(channels)
        self.Conv = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)

    def forward(self, x):
        return self.Conv(F.gelu(self.BN(x)))


class DepthWise_Conv(nn.Module):  # noqa: N801
    def __init__(self, channels):
        super().__init__()
        self.conv_merge = BN_Activ_Conv(channels)

    def forward(self, x):
        return self.conv_merge(x)


class TokenMixing(nn.Module):
    def __init__(self, channels, size):
        super().__init__()
        self.smlp_block = StripMLP_Block(channels, size)
        self.dwsc = DepthWise_Conv(channels)

    def forward(self, x):
        return self.smlp_block(self.dwsc(x))


class GRN(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, 1, dim))

    def forward(self, x):                               # (N, H, W, C)
        gx = x.pow(2).sum((1, 2), keepdim=True).sqrt()
        return self.gamma * x * (gx / (gx.mean(-1, keepdim=True) + 1e-6)) + self.beta + x


class ChannelMixing(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv_77 = nn.Conv2d(c, c, 7, padding=3, groups=c, bias=False)
        self.layer_norm = nn.LayerNorm(c)
        self.fc1 = nn.Linear(c, 3 * c)
        self.grn = GRN(3 * c)
        self.fc2 = nn.Linear(3 * c, c)

    def forward(self, x):
        t = self.conv_77(x).permute(0, 2, 3, 1)
        t = self.fc2(self.grn(F.gelu(self.fc1(self.layer_norm(t)))))
        return t.permute(0, 3, 1, 2)


class BasicBlock(nn.Module):
    def __init__(self, c, size):
        super().__init__()
        self.token_mixing = TokenMixing(c, size)
        self.channel_mixing = ChannelMixing(c)

    def forward(self, x):  # eval only: drop path is the identity
        x = x + self.token_mixing(x)
        return x + self.channel_mixing(x)


class OfficialStripMLP(nn.Module):
    def __init__(self, embed_dim=16, layers=(1, 1, 2, 1), img_size=32, num_classes=10):
        super().__init__()
        c, s = embed_dim, img_size // 4
        self.patch_embed = nn.Conv2d(3, c, 4, 4, bias=False)
        for i in range(4):
            blocks = nn.ModuleList(BasicBlock(c * 2 ** i, s // 2 ** i) for _ in range(layers[i]))
            setattr(self, f'blocks{i + 1}', blocks)
        for i in range(3):
            setattr(self, f'merging{i + 1}', nn.Conv2d(c * 2 ** i, c * 2 ** (i + 1), 2, 2, bias=False))
        self.conv_s1_28 = nn.Conv2d(2 * c, 4 * c, 2, 2, groups=2 * c, bias=False)
        self.conv_s1_14 = nn.Conv2d(4 * c, 8 * c, 2, 2, groups=4 * c, bias=False)
        self.conv_s2_14 = nn.Conv2d(4 * c, 8 * c, 2, 2, groups=4 * c, bias=False)
        self.head = nn.Linear(8 * c, num_classes)
        self.norm = nn.BatchNorm2d(8 * c)

    @staticmethod
    def run(blocks, x):
        for b in blocks:
            x = b(x)
        return x

    def forward(self, x):
        x = self.merging1(self.run(self.blocks1, self.patch_embed(x)))
        a = self.conv_s1_28(x)                          # stage-2 input -> stage 3
        b = self.conv_s1_14(a)                          # -> stage 4
        x = self.merging2(self.run(self.blocks2, x))
        c = self.conv_s2_14(x)                          # stage-3 input -> stage 4
        x = self.merging3(self.run(self.blocks3, x + a))
        x = self.run(self.blocks4, x + b + c)
        return self.head(self.norm(x).mean((2, 3)))


def StripMLPNet(img_size=224, patch_size=4, in_chans=3, num_classes=1000, embed_dim=80, layers=(2, 8, 14, 2),  # noqa: N802
                drop_rate=0.5, alpha=3, **kwargs):
    """The re-statement behind the official constructor's signature (``models/strip_mlp.py: StripMLPNet``), so
    that ``zoo bench --vs official:`` can be tested on it (eval mode: dropout and drop path do not act)."""
    if (patch_size, in_chans, alpha) != (4, 3, 3):
        raise NotImplementedError('the re-statement covers patch 4, 3 input channels and alpha 3 only')
    return OfficialStripMLP(embed_dim=embed_dim, layers=tuple(layers), img_size=img_size, num_classes=num_classes)
