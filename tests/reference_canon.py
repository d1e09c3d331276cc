"""An independent re-statement of the official Canon layer (facebookresearch/PhysicsLM4
``huggingface/canon_helper.py``: ``ShortConvolution`` on its plain-PyTorch path (``use_fast_conv1d=False``),
its ``step`` decoding path, and ``apply_canon`` with ``canon_residual``), written here from the paper (eq. 4.1)
and a reading of that code.

Canon(h)_t = h_t + sum_{i=0}^{k-1} w[:, k-1-i] * h_{t-i} (zero before t = 0); optional SiLU on the
convolution ("Act"); without the residual it is fla's ShortConvolution. Written as a loop over taps.
Decoding keeps a (B, m, k) cache of the last k inputs, oldest first: roll left, write h_t last,
output sum(cache * w) (+ residual).
"""
import torch
import torch.nn.functional as F


def canon_taps(h, weight, residual=True, activation=False):
    """h (B, T, m), weight (m, 1, k) -> (B, T, m)."""
    k, t = weight.shape[-1], h.shape[1]
    y = torch.zeros_like(h)
    for i in range(k):                                   # tap i reads h_{t-i}
        if i < t:
            y[:, i:] += h[:, :t - i] * weight[:, 0, k - 1 - i]
    if activation:
        y = F.silu(y)
    return h + y if residual else y


def canon_step(h_t, cache, weight, residual=True, activation=False):
    """One token h_t (B, m) with the official rolling cache (B, m, k) -> (output (B, m), new cache)."""
    cache = torch.roll(cache, shifts=-1, dims=-1).clone()
    cache[:, :, -1] = h_t
    y = (cache * weight[:, 0, :]).sum(-1)
    if activation:
        y = F.silu(y)
    return (h_t + y if residual else y), cache
