"""Single-level multi-head deformable cross-attention in pure PyTorch (runs on any device, with autograd).

Deformable DETR's ``MSDeformAttn`` ("Deformable DETR", Zhu et al., ICLR 2021, arXiv 2010.04159;
https://github.com/fundamentalvision/Deformable-DETR) with the two changes PIIP makes ("Parameter-Inverted
Image Pyramid Networks", Zhu et al., NeurIPS 2024, arXiv 2406.04330; https://github.com/OpenGVLab/PIIP,
``classification/ops/modules/ms_deform_attn.py``): the value width is ``int(dim * ratio)`` and the value
tokens may have their own width ``dim_feat``. PIIP uses one feature level, so this module is the L = 1 case.

Each query token looks at ``num_points`` bilinear samples per head on the value grid, around its reference
point (the centre of its own cell, normalised to [0, 1], so two grids covering the same image line up):

    location[q, h, p] = ref[q] + offset[q, h, p] / (W_value, H_value)      (offsets in value-grid pixels, (x, y))
    out[q, h]         = sum_p softmax_p(a[q, h, :])[p] * bilinear(value_h, location[q, h, p])

The official code calls a compiled CUDA kernel (no CPU path). Here the sampling is one ``F.grid_sample`` call
for all heads and points (``align_corners=False``, zero padding), the semantics of Deformable DETR's
``ms_deform_attn_core_pytorch`` reference, which its op test checks against the kernel.

Under ``torch.compile`` the sampling runs as ``torch.ops.zoo.grid_sample`` (the same ``F.grid_sample``, kept
whole): inductor otherwise fuses its own decomposition of ``grid_sample`` with the softmax and the weighted sum
into loops that recompute each sample's location and weights per channel, and PIIP-TSB ran 1.3-1.6x *slower*
compiled than eager (those kernels were ~45 % of the compiled forward; docs/runtimes.md). Eager and export
(``torch.export``, ONNX: ``GridSample``) see plain ``F.grid_sample``.

Parameter names equal the official ones (``sampling_offsets``, ``attention_weights``, ``value_proj``,
``output_proj``), so official state dicts load unchanged.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

__all__ = ['DeformCrossAttention', 'deform_attn_core', 'reference_points']


def _bilinear(value: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """``F.grid_sample`` as Deformable DETR samples: bilinear, zero padding, ``align_corners=False``."""
    return F.grid_sample(value, grid, mode='bilinear', padding_mode='zeros', align_corners=False)


@torch.library.custom_op('zoo::grid_sample', mutates_args=())
def _grid_sample_op(value: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """:func:`_bilinear` as one operator the compiler keeps."""
    return _bilinear(value, grid)


@_grid_sample_op.register_fake
def _(value: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    return value.new_empty(value.shape[0], value.shape[1], grid.shape[1], grid.shape[2])  # (N, C, Hg, Wg)


def _grid_sample_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _grid_sample_backward(ctx, grad: torch.Tensor):
    value, grid = ctx.saved_tensors
    # interpolation 0 = bilinear, padding 0 = zeros, align_corners False: the forward's settings
    grad_value, grad_grid = torch.ops.aten.grid_sampler_2d_backward(
        grad.contiguous(), value, grid, 0, 0, False, [ctx.needs_input_grad[0], ctx.needs_input_grad[1]])
    return grad_value, grad_grid


_grid_sample_op.register_autograd(_grid_sample_backward, setup_context=_grid_sample_setup)
# under autocast (bfloat16) the operator takes float32 inputs, so its fake (traced) and real outputs agree in dtype
# and the sampling runs in float32 as eager autocast's grid_sample does
torch.library.register_autocast('zoo::grid_sample', 'cpu', torch.float32)


def _grid_sample(value: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    compiling = torch.compiler.is_compiling() and not torch.compiler.is_exporting()
    return (_grid_sample_op if compiling else _bilinear)(value, grid)


def reference_points(grid: tuple[int, int], device=None, dtype=torch.float32) -> torch.Tensor:
    """Cell centres of an (H, W) token grid, normalised to [0, 1] as (x, y): (H*W, 2), row-major."""
    h, w = grid
    ys = (torch.arange(h, device=device, dtype=dtype) + 0.5) / h
    xs = (torch.arange(w, device=device, dtype=dtype) + 0.5) / w
    ref_y, ref_x = torch.meshgrid(ys, xs, indexing='ij')
    return torch.stack((ref_x.reshape(-1), ref_y.reshape(-1)), -1)  # (H*W, 2)


def deform_attn_core(value: torch.Tensor, value_grid: tuple[int, int], locations: torch.Tensor,
                     weights: torch.Tensor) -> torch.Tensor:
    """Weighted bilinear sampling of a single-level value map.

    value (B, Nv, M, Dh) with Nv = H*W of ``value_grid``; locations (B, Nq, M, P, 2) as (x, y) in [0, 1]
    (outside samples read zeros); weights (B, Nq, M, P). Returns (B, Nq, M*Dh).
    """
    b, _, m, _ = value.shape
    h, w = value_grid
    value = rearrange(value, 'b (h w) m d -> (b m) d h w', h=h, w=w)
    # grid_sample wants [-1, 1]; with align_corners=False, -1 and 1 are the outer edges of the border cells.
    grid = rearrange(2 * locations - 1, 'b q m p xy -> (b m) q p xy')
    sampled = _grid_sample(value, grid)  # (B*M, Dh, Nq, P)
    weights = rearrange(weights, 'b q m p -> (b m) 1 q p')
    # a broadcast multiply and sum: on a CPU about twice as fast as a batched matmul of (Dh x P) @ (P x 1) blocks
    out = (sampled * weights).sum(-1)  # (B*M, Dh, Nq)
    return rearrange(out, '(b m) d q -> b q (m d)', b=b, m=m)


class DeformCrossAttention(nn.Module):
    """Deformable cross-attention from a query token grid to a value token grid (one level).

    Args:
        dim: query width (and output width).
        dim_feat: value-token width (defaults to ``dim``).
        num_heads: heads M; must divide ``int(dim * ratio)``.
        num_points: sampling points P per head.
        ratio: value width = ``int(dim * ratio)`` (PIIP's ``deform_ratio``, 0.5 in all released configs).

    ``forward(query (B, Nq, dim), query_grid (Hq, Wq), value (B, Nv, dim_feat), value_grid (Hv, Wv))`` ->
    (B, Nq, dim).
    """

    def __init__(self, dim: int, dim_feat: int | None = None, num_heads: int = 16, num_points: int = 4,
                 ratio: float = 0.5):
        super().__init__()
        dim_feat = dim if dim_feat is None else dim_feat
        self.value_dim = int(dim * ratio)
        if self.value_dim % num_heads:
            raise ValueError(f'DeformCrossAttention: num_heads={num_heads} must divide the value width '
                             f'int(dim * ratio) = int({dim} * {ratio}) = {self.value_dim}')
        self.dim, self.num_heads, self.num_points = dim, num_heads, num_points
        self.sampling_offsets = nn.Linear(dim, num_heads * num_points * 2)
        self.attention_weights = nn.Linear(dim, num_heads * num_points)
        self.value_proj = nn.Linear(dim_feat, self.value_dim)
        self.output_proj = nn.Linear(self.value_dim, dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Deformable DETR's init: head h's points start on the ray at angle 2*pi*h/M, point p at distance p+1
        (direction scaled so its larger component is 1, i.e. on the square of radius p+1); uniform attention."""
        nn.init.zeros_(self.sampling_offsets.weight)
        theta = torch.arange(self.num_heads, dtype=torch.float32) * (2.0 * math.pi / self.num_heads)
        direction = torch.stack([theta.cos(), theta.sin()], -1)  # (M, 2) as (x, y)
        direction = direction / direction.abs().max(-1, keepdim=True).values
        scale = torch.arange(1, self.num_points + 1, dtype=torch.float32)
        bias = direction[:, None, :] * scale[None, :, None]  # (M, P, 2)
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(bias.reshape(-1))
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        nn.init.xavier_uniform_(self.value_proj.weight)
        nn.init.zeros_(self.value_proj.bias)
        nn.init.xavier_uniform_(self.output_proj.weight)
        nn.init.zeros_(self.output_proj.bias)

    def sampling(self, query: torch.Tensor, query_grid: tuple[int, int],
                 value_grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampling locations (B, Nq, M, P, 2) in [0, 1] and softmaxed weights (B, Nq, M, P) for a query."""
        m, p = self.num_heads, self.num_points
        if query.shape[1] != query_grid[0] * query_grid[1]:
            raise ValueError(f'DeformCrossAttention: query has {query.shape[1]} tokens but query_grid '
                             f'{tuple(query_grid)} has {query_grid[0] * query_grid[1]}')
        offsets = rearrange(self.sampling_offsets(query), 'b q (m p xy) -> b q m p xy', m=m, p=p, xy=2)
        weights = rearrange(self.attention_weights(query), 'b q (m p) -> b q m p', m=m, p=p).softmax(-1)
        ref = reference_points(query_grid, query.device, offsets.dtype)  # (Nq, 2)
        hv, wv = value_grid
        normaliser = offsets.new_tensor([wv, hv])  # offsets are in value-grid pixels, (x, y)
        locations = ref[None, :, None, None, :] + offsets / normaliser
        return locations, weights

    def forward(self, query: torch.Tensor, query_grid: tuple[int, int], value: torch.Tensor,
                value_grid: tuple[int, int]) -> torch.Tensor:
        if value.shape[1] != value_grid[0] * value_grid[1]:
            raise ValueError(f'DeformCrossAttention: value has {value.shape[1]} tokens but value_grid '
                             f'{tuple(value_grid)} has {value_grid[0] * value_grid[1]}')
        locations, weights = self.sampling(query, query_grid, value_grid)
        v = rearrange(self.value_proj(value), 'b n (m d) -> b n m d', m=self.num_heads)
        return self.output_proj(deform_attn_core(v, value_grid, locations, weights))
