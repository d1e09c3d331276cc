"""The selective scan: the chunked scans equal the sequential reference (Mamba's ``selective_scan_ref``
semantics: delta bias + softplus, grouped B/C, D skip, float32 accumulation), values and gradients.

The reference loop is re-stated in ``zoo.layers.selective_scan.selective_scan_ref`` from the recurrence in
the Mamba paper and /work/shared/references/mamba_yolo.md; it was compared with mamba-ssm's
``selective_scan_ref`` semantics (bias added before softplus, B/C repeated over channel groups, y read
from the state after the update, then + D u)."""
from __future__ import annotations

import pytest
import torch
from zoo.layers.selective_scan import (
    _auto_chunk,
    selective_scan,
    selective_scan_chunked,
    selective_scan_chunked_autograd,
    selective_scan_ref,
    selective_scan_segsum,
)
from zoo.layers.selective_scan_graph import selective_scan_loop, selective_scan_parallel


def _inputs(b=2, groups=4, dg=3, n=5, length=64, dtype=torch.float64, a_scale=1.0, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    kd = groups * dg
    t = dict(u=torch.randn(b, kd, length, generator=g, dtype=dtype),
             delta=torch.randn(b, kd, length, generator=g, dtype=dtype),
             A=-torch.exp(torch.rand(kd, n, generator=g, dtype=dtype) * a_scale),
             B=torch.randn(b, groups, n, length, generator=g, dtype=dtype) * 0.5,
             C=torch.randn(b, groups, n, length, generator=g, dtype=dtype) * 0.5,
             D=torch.randn(kd, generator=g, dtype=dtype),
             delta_bias=torch.randn(kd, generator=g, dtype=dtype))
    if grad:
        for v in t.values():
            v.requires_grad_(True)
    return t


FAST = [('chunked', selective_scan_chunked), ('chunked_autograd', selective_scan_chunked_autograd),
        ('segsum', selective_scan_segsum), ('parallel', selective_scan_parallel), ('loop', selective_scan_loop)]


@pytest.mark.parametrize('name,fn', FAST)
@pytest.mark.parametrize('length,chunk', [(1, 4), (7, 4), (64, 16), (100, 32), (257, 64)])
def test_fast_scans_equal_the_reference_float64(name, fn, length, chunk):
    t = _inputs(length=length)
    ref = selective_scan_ref(**t, delta_softplus=True)
    out = fn(**t, delta_softplus=True, chunk_size=chunk)
    assert out.dtype == torch.float64
    assert torch.allclose(out, ref, rtol=0, atol=1e-10), (out - ref).abs().max()


@pytest.mark.parametrize('name,fn', FAST)
def test_fast_scans_equal_the_reference_float32(name, fn):
    t = _inputs(length=300, dtype=torch.float32)
    ref = selective_scan_ref(**t, delta_softplus=True)
    out = fn(**t, delta_softplus=True, chunk_size=16)
    assert out.dtype == torch.float32
    assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5), (out - ref).abs().max()


def test_half_inputs_accumulate_in_float32_and_return_half():
    t = {k: v.to(torch.bfloat16) for k, v in _inputs(length=40, dtype=torch.float32).items()}
    ref = selective_scan_ref(**{k: v.float() for k, v in t.items()}, delta_softplus=True)
    out = selective_scan(**t)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), ref, atol=5e-2, rtol=2e-2)


def test_large_A_and_long_sequence_no_nan_where_division_by_the_decay_fails():
    """VMamba's pure-torch ``selective_scan_easy`` forms exp(S_t) * cumsum(dBu_s / exp(S_s)) inside a
    chunk; with |A| up to e^5 and a 256-long chunk exp(-S) overflows and the result is NaN. Ours only
    multiplies decays in (0, 1] and stays equal to the sequential reference."""
    t = _inputs(b=1, groups=2, dg=2, n=4, length=2048, a_scale=5.0)
    ref = selective_scan_ref(**t, delta_softplus=True)
    out = selective_scan(**t, chunk_size=256)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, ref, rtol=0, atol=1e-10)
    out32 = selective_scan(**{k: v.float() for k, v in t.items()}, chunk_size=256)
    assert torch.isfinite(out32).all() and torch.allclose(out32.double(), ref, atol=1e-4, rtol=1e-4)
    # the division formulation on the same inputs, one 256-long chunk, float32 as in VMamba
    d = torch.nn.functional.softplus(t['delta'] + t['delta_bias'][:, None]).float()[..., :256]
    S = torch.cumsum(d[..., None] * t['A'].float()[:, None, :], dim=2)          # (B, KD, T, N)
    dbu = (d * t['u'].float()[..., :256])[..., None] * t['B'].float().repeat_interleave(2, 1)[..., :256].transpose(2, 3)
    h_easy = torch.exp(S) * torch.cumsum(dbu / torch.exp(S), dim=2)
    assert not torch.isfinite(h_easy).all()


def test_grouped_B_C_equal_per_channel_copies():
    t = _inputs(length=50)
    dg = t['u'].shape[1] // t['B'].shape[1]
    per_channel = dict(t, B=t['B'].repeat_interleave(dg, 1), C=t['C'].repeat_interleave(dg, 1))
    assert torch.allclose(selective_scan(**t), selective_scan(**per_channel), atol=1e-12)
    assert torch.allclose(selective_scan_ref(**t, delta_softplus=True), selective_scan(**per_channel), atol=1e-10)


def test_single_step_closed_form_bias_softplus_and_D_skip():
    t = _inputs(b=1, groups=1, dg=3, n=4, length=1)
    d = torch.nn.functional.softplus(t['delta'] + t['delta_bias'][:, None])      # (1, 3, 1)
    expected = (t['C'][:, 0, :, 0] * t['B'][:, 0, :, 0]).sum(-1) * d[..., 0] * t['u'][..., 0] + t['D'] * t['u'][..., 0]
    assert torch.allclose(selective_scan(**t)[..., 0], expected, atol=1e-12)
    # without softplus the raw delta + bias is the step
    no_sp = selective_scan(**t, delta_softplus=False)
    assert torch.allclose(selective_scan_ref(**t, delta_softplus=False), no_sp, atol=1e-12)
    assert not torch.allclose(no_sp, selective_scan(**t))


@pytest.mark.parametrize('name,fn', FAST)
def test_gradients_equal_the_reference(name, fn):
    ta, tb = _inputs(length=45, grad=True), _inputs(length=45, grad=True)
    w = torch.randn(2, 12, 45, dtype=torch.float64)
    (selective_scan_ref(**ta, delta_softplus=True) * w).sum().backward()
    (fn(**tb, delta_softplus=True, chunk_size=8) * w).sum().backward()
    for k in ta:
        assert torch.allclose(ta[k].grad, tb[k].grad, atol=1e-9, rtol=1e-9), k


def test_gradcheck_chunked():
    t = _inputs(b=1, groups=2, dg=1, n=2, length=9, grad=True)
    names = list(t)
    assert torch.autograd.gradcheck(lambda *a: selective_scan(**dict(zip(names, a)), chunk_size=4),
                                     tuple(t.values()))


def test_auto_chunk_and_errors():
    assert _auto_chunk(6400) == 128 and _auto_chunk(1024) == 64 and _auto_chunk(10 ** 6) == 256
    assert _auto_chunk(100) == 100 and _auto_chunk(129) == 32 and _auto_chunk(400) == 32
    t = _inputs(length=10)
    with pytest.raises(ValueError, match='unknown scan method'):
        selective_scan(**t, method='fast')
    with pytest.raises(ValueError, match='B and C must be'):
        selective_scan(**dict(t, B=t['B'][..., :5]))
    with pytest.raises(ValueError, match='multiple of the B/C groups'):
        selective_scan(**dict(t, B=t['B'][:, :1].expand(-1, 5, -1, -1), C=t['C'][:, :1].expand(-1, 5, -1, -1)))
    with pytest.raises(RuntimeError, match='mamba-ssm'):
        selective_scan(**t, method='cuda')


@pytest.mark.parametrize('kw', [dict(), dict(delta_softplus=False), dict(delta_bias=None, D=None), dict(groups=1),
                                dict(chunk=16)])
def test_gradcheck_hand_written_backward_options(kw):
    """The chunked scan's backward is written by hand (``zoo::selective_scan_backward``): gradcheck it in float64 with the
    options off one at a time, a chunk that does not divide L (padding), one chunk (no first pass, no carry)
    and B/C given as one (B, N, L) group."""
    groups, chunk = kw.pop('groups', 2), kw.pop('chunk', 4)
    t = _inputs(b=2, groups=groups, dg=2, n=3, length=11, a_scale=2.0)
    if groups == 1:
        t['B'], t['C'] = t['B'][:, 0], t['C'][:, 0]
    if kw.get('delta_softplus') is False:  # raw steps must be positive, else the decays exceed 1 and blow up
        t['delta'], t['delta_bias'] = t['delta'].abs(), t['delta_bias'].abs()
    t.update(kw)
    names = [k for k, v in t.items() if isinstance(v, torch.Tensor)]
    args = tuple(t[k].requires_grad_(True) for k in names)
    assert torch.autograd.gradcheck(lambda *a: selective_scan(**dict(t, **dict(zip(names, a))), chunk_size=chunk), args)


def test_hand_written_backward_equals_autograd_large_A_long_L():
    """float64, |A| up to e^4, L = 700, chunk 64 (11 chunks, the last one padded): the hand-written backward
    equals autograd through the sequential reference to 1e-9 (relative to each gradient's largest entry) and
    autograd through the same chunked passes (``chunked_autograd``) likewise."""
    ta, tb, tc = (_inputs(b=1, groups=4, dg=2, n=4, length=700, a_scale=4.0, grad=True) for _ in range(3))
    w = torch.randn(1, 8, 700, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (selective_scan_ref(**ta, delta_softplus=True) * w).sum().backward()
    (selective_scan(**tb, chunk_size=64) * w).sum().backward()
    (selective_scan_chunked_autograd(**tc, delta_softplus=True, chunk_size=64) * w).sum().backward()
    for k in ta:
        scale = ta[k].grad.abs().max()
        assert torch.isfinite(tb[k].grad).all(), k
        assert (tb[k].grad - ta[k].grad).abs().max() <= 1e-9 * scale, k
        assert (tb[k].grad - tc[k].grad).abs().max() <= 1e-9 * scale, k


def test_inference_mode_and_no_grad_give_the_same_values():
    t = _inputs(length=50)
    ref = selective_scan(**t, chunk_size=16)
    with torch.inference_mode():
        assert torch.equal(selective_scan(**t, chunk_size=16), ref)
    with torch.no_grad():
        assert torch.equal(selective_scan(**t, chunk_size=16), ref)


def test_scan_bench_rows_and_share_are_consistent():
    """benchmarks/scan_bench at toy sizes (no timing asserted): every candidate is exact against the float64
    scan, and the SS2D / scan shares of a Mamba-YOLO's time are nested fractions."""
    from benchmarks import scan_bench
    rows = scan_bench.scan_rows(size=32, stride=4, chunks=(4, 8), repeats=1, modes=('inference',))
    # L = 64: the auto chunk is the whole sequence
    assert {r['case'] for r in rows} == {'sequential', 'chunked/4', 'chunked/8', 'chunked_autograd/64'}
    assert all(float(r['max_abs_err']) < 1e-4 for r in rows)
    (share,) = scan_bench.share_rows(sizes=(64,), repeats=1, name='mamba_yolo_tiny')
    assert 0 < share['scan_share'] <= share['ss2d_share'] <= 1


class _Scan(torch.nn.Module):
    def forward(self, u, delta, B, C):
        return selective_scan(u, delta, self.A, B, C, self.D, self.bias, delta_softplus=True)


def _scan_module(length, dtype=torch.float32):
    t = _inputs(length=length, dtype=dtype)
    m = _Scan()
    m.A, m.D, m.bias = t['A'], t['D'], t['delta_bias']
    return m, (t['u'], t['delta'], t['B'], t['C'])


def _targets(graph):
    return [n.target for n in graph.nodes if n.op == 'call_function']


def test_the_scan_operator_passes_opcheck():
    """torch.library.opcheck: schema, fake (meta) implementation with the real strides, autograd registration and
    AOT dispatch with dynamic shapes; with and without D, bias and softplus, a padded last chunk and one chunk."""
    from zoo.layers.selective_scan import _check
    for length, chunk in ((11, 4), (9, 9)):
        u, delta, A, B, C, D, bias = _check(*_inputs(b=2, groups=2, dg=2, n=3, length=length, grad=True).values())
        for args in ((u, delta, A, B, C, D, bias, True, chunk), (u, delta, A, B, C, None, None, False, chunk)):
            torch.library.opcheck(torch.ops.zoo.selective_scan, args)


def test_export_captures_one_operator_and_onnx_writes_it_out_as_loops():
    """torch.export keeps the eager chunked scan as one node, ``zoo::selective_scan`` (its Python loops would
    unroll into thousands of nodes); ``decompose`` (what ONNX export runs first) exports it written out as two
    ``scan`` loops and a log-depth carry: a graph whose size does not grow with L. Both equal the eager scan."""
    from zoo.layers.selective_scan_graph import decompose
    nodes = {}
    for length in (256, 4096):  # chunks of 32 and 128 (the eager scan's): 8 and 32 chunks
        m, args = _scan_module(length)
        ep = torch.export.export(m, args)
        assert _targets(ep.graph).count(torch.ops.zoo.selective_scan.default) == 1
        assert len(ep.graph.nodes) < 40
        ref = m(*args)
        torch.testing.assert_close(ep.module()(*args), ref, rtol=0, atol=0)
        graph = decompose(ep, args)
        targets = _targets(graph.graph)
        assert torch.ops.zoo.selective_scan.default not in targets
        assert targets.count(torch.ops.higher_order.scan) == 2
        nodes[length] = len(graph.graph.nodes)
        out = graph.module()(*args)
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-5), (out - ref).abs().max()
    assert nodes[4096] < 200 and nodes[4096] - nodes[256] <= 16 * 2, nodes  # log-depth carry: ~14 ops per doubling


def test_compiled_training_uses_the_hand_written_backward_and_equals_eager():
    """torch.compile (inductor) of a forward + backward in float64: the forward and backward operators are opaque
    nodes (no unrolled loop), and every gradient equals the eager operator's (and so the reference's)."""
    t = _inputs(b=2, groups=2, dg=2, n=3, length=37, a_scale=2.0)
    w = torch.randn(2, 4, 37, dtype=torch.float64, generator=torch.Generator().manual_seed(5))

    def loss(u, delta, A, B, C, D, delta_bias):
        return (selective_scan(u, delta, A, B, C, D, delta_bias, chunk_size=8) * w).sum()

    graphs = []

    def backend(gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd
        from torch._inductor.compile_fx import compile_fx_inner

        def keep(g, ex):
            graphs.append(g)
            return compile_fx_inner(g, ex)
        return aot_autograd(fw_compiler=keep, bw_compiler=keep)(gm, example_inputs)

    grads = {}
    for name, fn in (('eager', loss), ('compiled', torch.compile(loss, backend=backend, fullgraph=True))):
        args = [v.clone().requires_grad_(True) for v in t.values()]
        fn(*args).backward()
        grads[name] = [a.grad for a in args]
    torch._dynamo.reset()
    fw, bw = (_targets(g.graph) for g in graphs)
    assert torch.ops.zoo.selective_scan.default in fw and torch.ops.zoo.selective_scan_backward.default in bw
    assert len(fw) < 60 and len(bw) < 60, (len(fw), len(bw))
    for name, a, b in zip(t, grads['eager'], grads['compiled']):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12, msg=name)


def test_the_mac_counter_sees_the_scan_operator():
    """FlopCounterMode cannot look inside the operator: zoo.eval.profile teaches it the products the eager scan runs,
    so an SS2D block counts the same MACs with the operator ('chunked') as with plain ops ('chunked_autograd')."""
    from zoo.eval.profile import count_macs
    from zoo.layers.mamba import SS2D

    block = SS2D(16, d_state=4)
    macs = {}
    for method in ('chunked', 'chunked_autograd'):
        block.scan_method = method
        macs[method] = count_macs(block, example=torch.randn(2, 16, 9, 7))
    assert macs['chunked'] == macs['chunked_autograd'] > 0
