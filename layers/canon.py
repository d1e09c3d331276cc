"""Canon layers: a causal depthwise 1-d convolution with its own residual.

"Physics of Language Models: Part 4.1 — Architecture Design and the Magic of Canon Layers",
Z. Allen-Zhu, NeurIPS 2025 (arXiv 2512.17351). Official code: https://github.com/facebookresearch/PhysicsLM4
(``huggingface/canon_helper.py``).

At token t with hidden h_t in R^m::

    h'_t = h_t + w0 * h_t + w1 * h_{t-1} + w2 * h_{t-2} + w3 * h_{t-3}      (zero padding before t = 0)

implemented as ``nn.Conv1d(m, m, kernel_size=4, groups=m, bias=False, padding=3)`` keeping the first T
outputs, so ``weight[:, 0, -1]`` multiplies h_t and ``weight[:, 0, 0]`` multiplies h_{t-3}.
The weights keep PyTorch's default Conv1d initialisation (U(-1/sqrt(k), 1/sqrt(k)), std ~0.289 for k = 4):
the paper's demo warns against re-initialising them to 0.02, so model-level inits must skip Canon
modules (they carry ``skip_global_init = True``).

Padding: ``forward``/``extend`` take an attention mask (B, L) of 1 = token, 0 = padding, as the official
``apply_canon`` does (HF's 2-d form; its last T columns belong to the T inputs, so a mask covering a cached
prefix as well works). Padded positions are zeroed before the convolution, so a left-padded sequence's real
tokens see the same zero history as the unpadded sequence. Unlike the official ``ShortConvolution`` the input
is not overwritten in place, and zeroing uses ``where`` rather than a product, so a non-finite value at a padded
position cannot leak into real ones.

Chunked prefill: ``extend`` continues a sequence by any number of tokens from the rolling cache. The official
cached path uses the cache only for one-token steps; a multi-token chunk after a cached prefix is convolved with
zero padding there (the cache is overwritten, not read), so its first k - 1 outputs miss their history. Here
every chunk size gives the full-sequence result (tested).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ._registry import register

__all__ = ['Canon', 'ShortConv', 'apply_cached', 'parse_canon_set', 'zero_padding']

CANON_POINTS = 'ABCD'


def parse_canon_set(canon: str | None) -> str:
    """Validate a Canon placement string (any subset of 'ABCD', '' or None = no Canon layers)."""
    canon = canon or ''
    if not isinstance(canon, str) or any(c not in CANON_POINTS for c in canon) or len(set(canon)) != len(canon):
        raise ValueError(f"canon must be a subset of 'ABCD' without repeats (e.g. 'AC', 'ABCD' or ''), got {canon!r}")
    return ''.join(c for c in CANON_POINTS if c in canon)


@register('canon', 'canon', layout='nlc', example=dict(dim=16), example_input=(2, 10, 16))
class Canon(nn.Module):
    """Canon layer ``h + causal_depthwise_conv1d(h)`` on (B, T, m) sequences (paper eq. 4.1).

    Args:
        dim: channels m (the layer has exactly ``kernel_size * m`` parameters, no bias).
        kernel_size: taps, 2 to 6 (the paper uses 4).
        residual: add the input back (Canon(res)); ``False`` is the paper's "NoRes" ablation.
        activation: apply SiLU to the convolution (the paper's "Act" ablation; off by default).
    """
    skip_global_init = True

    def __init__(self, dim: int, kernel_size: int = 4, residual: bool = True, activation: bool = False):
        super().__init__()
        if not isinstance(kernel_size, int) or not 2 <= kernel_size <= 6:
            raise ValueError(f'Canon kernel_size must be an integer in 2..6 (the paper uses 4), got {kernel_size!r}')
        if dim < 1:
            raise ValueError(f'Canon needs dim >= 1, got {dim}')
        self.dim, self.kernel_size, self.residual, self.activation = dim, kernel_size, residual, activation
        # PyTorch's default Conv1d init: kaiming_uniform(a=sqrt(5)) -> U(-1/sqrt(k), 1/sqrt(k)).
        self.conv = nn.Conv1d(dim, dim, kernel_size, groups=dim, bias=False, padding=kernel_size - 1)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """h: (B, T, m); mask: optional (B, L >= T) attention mask, 1 = token, 0 = padding (its last T columns)."""
        if h.ndim != 3 or h.shape[-1] != self.dim:
            raise ValueError(f'Canon expects (B, T, {self.dim}) inputs, got shape {tuple(h.shape)}')
        t = h.shape[1]
        x = zero_padding(h, mask)
        y = self.conv(rearrange(x, 'b t m -> b m t'))[..., :t]  # left padding k-1: keep the causal outputs
        y = rearrange(y, 'b m t -> b t m')
        if self.activation:
            y = F.silu(y)
        return h + y if self.residual else y

    def init_cache(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        """An empty rolling cache (B, m, k) for step-by-step decoding."""
        return torch.zeros(batch, self.dim, self.kernel_size, device=device, dtype=dtype or self.conv.weight.dtype)

    def step(self, h_t: torch.Tensor, cache: torch.Tensor, mask: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode one token: ``h_t`` (B, m), cache (B, m, k) -> (output (B, m), new cache).

        The cache holds the last k inputs, oldest first, so it lines up with the kernel taps; the output is
        ``sum(cache * w)`` plus the residual (``extend`` with one token).
        """
        y, cache = self.extend(h_t.unsqueeze(1), cache, mask)            # (B, 1, m)
        return y[:, 0], cache

    def extend(self, h: torch.Tensor, cache: torch.Tensor | None = None, mask: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Continue a sequence by T tokens: ``h`` (B, T, m), cache (B, m, k) of the last k inputs (oldest first;
        ``None`` = a fresh sequence, i.e. zero padding) -> (output (B, T, m), new cache). Prefill (T > 1), chunks
        of any size and one-token decoding (T = 1, ``step``) in one code path. ``mask``: as in ``forward``; padded
        inputs enter the window as zeros."""
        if h.ndim != 3 or h.shape[-1] != self.dim:
            raise ValueError(f'Canon expects (B, T, {self.dim}) inputs, got shape {tuple(h.shape)}')
        if cache is None:
            cache = self.init_cache(h.shape[0], h.device, h.dtype)
        x = zero_padding(h, mask)
        full = torch.cat([cache, rearrange(x, 'b t m -> b m t')], dim=-1)  # (B, m, k + T), history first
        windows = full[..., 1:].unfold(-1, self.kernel_size, 1)             # (B, m, T, k): each output's last k inputs
        # taps as a product-sum, not conv1d: a one-token conv1d costs ~4x more on CPU (per-call overhead)
        y = rearrange((windows * self.conv.weight[:, None, 0, :]).sum(-1), 'b m t -> b t m')
        if self.activation:
            y = F.silu(y)
        return (h + y if self.residual else y), full[..., -self.kernel_size:]

    def extra_repr(self) -> str:
        return f'dim={self.dim}, kernel_size={self.kernel_size}, residual={self.residual}, activation={self.activation}'


class ShortConv(Canon):
    """The linear models' own short convolution ("Canon-b"): SiLU, no residual (fla's ShortConvolution).

    Part of the baseline model (not a Canon insertion), so a model-level init redraws it (``reset_parameters``)
    in module order with PyTorch's default Conv1d init."""

    def __init__(self, dim: int, kernel_size: int = 4):
        super().__init__(dim, kernel_size, residual=False, activation=True)

    def reset_parameters(self) -> None:
        self.conv.reset_parameters()


def zero_padding(h: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Zero the padded positions of ``h`` (B, T, ...): ``mask`` (B, L >= T), 1 = token, 0 = padding, whose last
    T columns belong to ``h`` (the official ``apply_canon`` slicing). ``None`` returns ``h`` unchanged."""
    if mask is None:
        return h
    b, t = h.shape[:2]
    if mask.ndim != 2 or mask.shape[0] != b or mask.shape[1] < t:
        raise ValueError(f'attention mask must be (B, L) with B = {b} and L >= {t} (1 = token, 0 = padding), '
                         f'got shape {tuple(mask.shape)}')
    keep = mask[:, -t:].bool().reshape(b, t, *([1] * (h.ndim - 2)))   # (B, T, 1, ...)
    return torch.where(keep, h, h.new_zeros(()))


def apply_cached(layer: Canon | None, h: torch.Tensor, cache: dict | None, key: str,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
    """Run an optional Canon / short conv: identity if ``layer`` is None, the full forward if ``cache`` is None,
    else ``layer.extend`` with its rolling cache kept in ``cache[key]`` (updated in place). ``mask``: the
    attention mask (B, L), padded inputs zeroed before the convolution."""
    if layer is None:
        return h
    if cache is None:
        return layer(h, mask)
    y, cache[key] = layer.extend(h, cache.get(key), mask)
    return y
