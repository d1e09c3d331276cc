"""An independent re-statement of the official weighted convolution (cammarasana123/weightedConvolution2.0
``wConv.py``: ``wConv1d`` / ``wConv2d`` / ``wConv3d``; the v1 formulation of cammarasana123/weightedConvolution
``dConv.py``), written here from the paper (arXiv 2505.24558) and a reading of that code.

Written the v1 way, which is independent of ours (we scale the kernel by Phi and call one convolution):
unfold the input into k x k patches, multiply every patch by the filter, sum over input channels, then
contract the patch with the density profile on rows and on columns, sum_hw alfa_h * alfa_w * (patch * W)_hw,
with alfa = [*den, 1, *reversed(den)] (the outermost ring first). Groups = 1, dilation 1.
"""
import torch
import torch.nn.functional as F


def alfa(den):
    d = torch.as_tensor(den, dtype=torch.float32)
    return torch.cat([d, torch.ones(1), d.flip(0)])


def weighted_conv2d_unfold(x, weight, bias, den, stride=1, padding=1):
    """(B, Cin, H, W) -> (B, Cout, H', W') by patches; ``weight`` (Cout, Cin, k, k)."""
    cout, cin, k, _ = weight.shape
    b, _, h, w = x.shape
    ho, wo = (h + 2 * padding - k) // stride + 1, (w + 2 * padding - k) // stride + 1
    patches = F.unfold(x, k, padding=padding, stride=stride).view(b, cin, k, k, ho * wo)
    prod = torch.einsum('bcijl,ocij->boijl', patches, weight)             # per-tap products, summed over Cin
    a = alfa(den)
    y = torch.einsum('boijl,i,j->bol', prod, a, a).view(b, cout, ho, wo)
    return y if bias is None else y + bias[None, :, None, None]


def weighted_conv1d_direct(x, weight, den, padding=1):
    """(B, Cin, L) -> (B, Cout, L'), by shifted slices: y[t] = sum_i alfa_i * W[:, :, i] @ x[t + i - padding]."""
    k = weight.shape[-1]
    xp = F.pad(x, (padding, padding))
    lo = xp.shape[-1] - k + 1
    a = alfa(den)
    return sum(a[i] * torch.einsum('oc,bcl->bol', weight[:, :, i], xp[..., i:i + lo]) for i in range(k))
