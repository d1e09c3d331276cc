"""An independent re-statement of the official PoolFormer (sail-sg/poolformer ``models/poolformer.py``),
written from ../shared/references/metaformer_poolformer.md with the official module names, so the
tests can check that official-layout checkpoints load into zoo and give the same logits.
Deliberately plain: NCHW, no fusion, no registry.
"""
import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Conv2d(dim, hidden, 1)
        self.act = nn.GELU()
        self.fc2 = nn.Conv2d(hidden, dim, 1)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, ls):
        super().__init__()
        self.norm1 = nn.GroupNorm(1, dim)
        self.token_mixer = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.norm2 = nn.GroupNorm(1, dim)
        self.mlp = Mlp(dim, 4 * dim)
        self.layer_scale_1 = nn.Parameter(ls * torch.ones(dim))
        self.layer_scale_2 = nn.Parameter(ls * torch.ones(dim))

    def forward(self, x):
        y = self.norm1(x)
        x = x + self.layer_scale_1[:, None, None] * (self.token_mixer(y) - y)
        return x + self.layer_scale_2[:, None, None] * self.mlp(self.norm2(x))


class Embed(nn.Module):
    def __init__(self, cin, cout, k, s, p):
        super().__init__()
        self.proj = nn.Conv2d(cin, cout, k, s, p)

    def forward(self, x):
        return self.proj(x)


class OfficialPoolFormer(nn.Module):
    def __init__(self, layers=(2, 2, 6, 2), dims=(64, 128, 320, 512), num_classes=1000, ls=1e-5):
        super().__init__()
        self.patch_embed = Embed(3, dims[0], 7, 4, 2)
        net = []
        for i, (n, d) in enumerate(zip(layers, dims)):
            net.append(nn.Sequential(*[Block(d, ls) for _ in range(n)]))
            if i < len(dims) - 1:
                net.append(Embed(d, dims[i + 1], 3, 2, 1))
        self.network = nn.ModuleList(net)
        self.norm = nn.GroupNorm(1, dims[-1])
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        for m in self.network:
            x = m(x)
        return self.head(self.norm(x).mean([-2, -1]))
