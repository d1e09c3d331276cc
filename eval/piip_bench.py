"""PIIP benchmarks (issue 18): the deformable cross-attention core and the PIIP models, on the CPU.

    python -m zoo.eval.piip_bench deform            # batched grid_sample core vs one grid_sample per head
    python -m zoo.eval.piip_bench models            # params, MACs, latency: piip_tsb vs ViT-B and its branches

Timings are interleaved (``zoo.eval.profile.benchmark``); run on a quiet machine, the numbers of a shared
one are noise. No Lightning, no training.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from zoo.layers.deform_attn import DeformCrossAttention, deform_attn_core

from .profile import benchmark


def per_head_core(value, value_grid, locations, weights):
    """The same computation with one grid_sample call per head (the layout of a naive port), for comparison."""
    b, _, m, dh = value.shape
    h, w = value_grid
    outs = []
    for head in range(m):
        v = rearrange(value[:, :, head], 'b (h w) d -> b d h w', h=h, w=w)
        s = F.grid_sample(v, 2 * locations[:, :, head] - 1, mode='bilinear', padding_mode='zeros',
                          align_corners=False)  # (B, Dh, Nq, P)
        outs.append((s * weights[:, None, :, head]).sum(-1))  # (B, Dh, Nq)
    return rearrange(torch.stack(outs, 1), 'b m d q -> b q (m d)')


class _Deform(nn.Module):
    """One interaction direction of PIIP-TSB (query grid -> value grid) as a model taking the query tokens."""

    def __init__(self, dim, qgrid, vgrid, core):
        super().__init__()
        self.attn, self.qgrid, self.vgrid, self.core = DeformCrossAttention(dim), qgrid, vgrid, core
        self.register_buffer('value', torch.randn(1, vgrid[0] * vgrid[1], dim))

    def forward(self, q):
        a = self.attn
        loc, wgt = a.sampling(q, self.qgrid, self.vgrid)
        v = rearrange(a.value_proj(self.value.expand(q.shape[0], -1, -1)), 'b n (m d) -> b n m d', m=a.num_heads)
        return a.output_proj(self.core(v, self.vgrid, loc, wgt))


def bench_deform(repeats: int, threads: int | None) -> None:
    # PIIP-TSB 368/192/128: T (23x23 grid, 192) <-> S (12x12, 384) and S <-> B (8x8, 768)
    cases = [('T<-S', 192, (23, 23), (12, 12)), ('S<-T', 384, (12, 12), (23, 23)), ('B<-S', 768, (8, 8), (12, 12))]
    for name, dim, qg, vg in cases:
        torch.manual_seed(0)
        batched = _Deform(dim, qg, vg, deform_attn_core)
        looped = _Deform(dim, qg, vg, per_head_core)
        looped.load_state_dict(batched.state_dict())
        x = torch.randn(8, qg[0] * qg[1], dim)
        with torch.no_grad():
            diff = (batched(x) - looped(x)).abs().max().item()
        res = benchmark({'batched': batched, 'per_head': looped}, input_size=tuple(x.shape[1:]), batch_size=8,
                        repeats=repeats, threads=threads, inputs={'batched': x, 'per_head': x})
        b, p = res['batched'].median_ms, res['per_head'].median_ms
        print(f'{name:5s} dim {dim:3d} {qg}->{vg} batch 8: batched {b:.2f} ms, per-head {p:.2f} ms '
              f'(x{p / b:.2f}); max |diff| {diff:.1e}')


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('what', choices=['deform', 'models'])
    ap.add_argument('--repeats', type=int, default=20)
    ap.add_argument('--threads', type=int, default=None)
    args = ap.parse_args(argv)
    if args.what == 'deform':
        bench_deform(args.repeats, args.threads)
    else:
        bench_models(args.repeats, args.threads)


if __name__ == '__main__':
    main()
