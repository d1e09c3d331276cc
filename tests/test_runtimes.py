"""Runtimes (issue 26): every family's tiny variant exports (torch.export and ONNX, dynamic batch) and runs in ONNX
Runtime with eager's outputs; zoo.optimize keeps eager's outputs and a detector's detections; export(nms=True)
gives a deployable detector with eager's boxes."""
from __future__ import annotations

import re

import pytest
import torch
from conftest import example_input, model_output
from zoo.layers.sequence_mixers import gla_chunked, gla_recurrent

import zoo

ort = pytest.importorskip('onnxruntime', reason="the export extra: pip install 'zoo[export]'")

TINY = zoo.list_models(tiny=True)  # one per family
REL = 1e-4


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12)).item()


def _main(model, outs):
    """The exported graph's outputs as ``model_output`` gives them (a dense model's maps per level concatenated)."""
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    if len(outs) > 1 and all(o.ndim == 4 for o in outs):
        return torch.cat([o.flatten(2) for o in outs], 2)
    return outs[0]


def _ort(path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=['CPUExecutionProvider'])
    return lambda x: [torch.from_numpy(o) for o in sess.run(None, {sess.get_inputs()[0].name: x.numpy()})]


@pytest.mark.parametrize('name', TINY)
def test_export_pt2_and_onnx(name, tmp_path):
    """torch.export (saved, loaded) and ONNX from it, traced at batch 2, equal to eager at batches 2 and 3."""
    torch.manual_seed(0)
    model = zoo.create(name).eval()
    x2, x3 = example_input(name, 2), example_input(name, 3, seed=1)
    with torch.no_grad():
        refs = {2: model_output(model, x2), 3: model_output(model, x3)}
    ep = torch.export.load(zoo.export(model, tmp_path / 'model.pt2', x2, format='pt2'))
    with torch.no_grad():
        assert _rel(_main(model, ep.module()(x3)), refs[3]) <= REL
    run = _ort(zoo.export(ep, tmp_path / 'model.onnx', x2))
    for x, ref in ((x2, refs[2]), (x3, refs[3])):
        out = _main(model, run(x))
        assert out.shape == ref.shape
        assert _rel(out, ref) <= REL, name


@pytest.fixture(scope='module')
def detector():
    """A tiny YOLOv8 detector (ResNet backbone: cheap to export; Mamba-YOLO's network is exported above) whose
    class priors put every anchor above the NMS threshold (real NMS work)."""
    torch.manual_seed(0)
    model = zoo.create('yolo_det', backbone='resnet_tiny', backbone_kwargs={'stem': 'imagenet'}, num_classes=3)
    model.eval().head.reset_bias(image_size=64)  # prior ~0.03 per class: all 3 x 84 pairs pass conf=0.001
    return model, example_input('yolo_det_tiny', 2), example_input('yolo_det_tiny', 3, seed=1)


def _same_detections(a: dict, b: dict) -> None:
    """The same set of (box, score, label): every detection of ``a`` has one in ``b`` (random weights give tied
    scores, so an order is no key)."""
    assert len(a['scores']) == len(b['scores']) > 0
    same = ((a['labels'].long()[:, None] == b['labels'].long()[None])
            & ((a['scores'][:, None] - b['scores'][None]).abs() <= 1e-5 + 1e-4 * b['scores'][None])
            & ((a['boxes'][:, None] - b['boxes'][None]).abs() <= 1e-3 + 1e-4 * b['boxes'][None].abs()).all(-1))
    assert same.any(1).all() and same.any(0).all()


def test_optimize_detector_same_detections(detector):
    """The network in ONNX Runtime, decode + NMS + inverse letterbox eagerly: eager's detections, file pixels."""
    model, x2, x3 = detector
    fast = zoo.optimize(model, 'onnxruntime', example=x2)
    metas = [{'orig_size': (50, 70), 'scale': (64 / 70, 64 / 70), 'pad': (0, 7)}] * 3
    with torch.no_grad():
        want = model(x3, metas)
    got = fast(x3, metas)
    assert len(got) == 3
    for g, w in zip(got, want):
        _same_detections(g, w)
    torch.testing.assert_close(model_output(fast, x3), model_output(model, x3), rtol=1e-4, atol=1e-4)


def test_export_nms_runs_in_ort(detector, tmp_path):
    """export(nms=True): decode and NMS in the graph, (B, max_det, 6) rows, the boxes eager's predict gives."""
    model, x2, x3 = detector
    run = _ort(zoo.export(model, tmp_path / 'det.onnx', x2, nms=True))
    (dets,) = run(x3)
    assert dets.shape == (3, model.head.max_det, 6)
    with torch.no_grad():
        want = model(x3)
    for rows, w in zip(dets, want):
        rows = rows[rows[:, 5] >= 0]
        assert torch.all(rows[:-1, 4] >= rows[1:, 4])  # best first
        _same_detections({'boxes': rows[:, :4], 'scores': rows[:, 4], 'labels': rows[:, 5]}, w)


@pytest.mark.parametrize('name', ['dncnn_tiny', 'gla_tiny'])
def test_optimize_compile(name):
    """torch.compile with inductor freezing keeps eager's outputs (GLA: its torch.cond intra-chunk branch)."""
    model = zoo.create(name).eval()
    x = example_input(name, 2)
    with torch.no_grad():
        ref = model_output(model, x)
    fast = zoo.optimize(model, 'compile', example=x)
    assert _rel(model_output(fast, x), ref) <= REL


def test_optimize_openvino_and_eager():
    pytest.importorskip('openvino')
    model = zoo.create('resnet_tiny').eval()
    x2, x3 = example_input('resnet_tiny', 2), example_input('resnet_tiny', 3, seed=1)
    with torch.no_grad():
        ref = model(x3)
    assert _rel(zoo.optimize(model, 'openvino', example=x2)(x3), ref) <= REL
    assert torch.equal(zoo.optimize(model, 'eager')(x3), ref)


def test_gla_strong_gates_branch_in_the_graph():
    """The exported GLA keeps both intra-chunk forms: gates too strong for the factorised one take the exact one."""

    class Mixer(torch.nn.Module):
        def forward(self, q, k, v, log_a):
            return gla_chunked(q, k, v, log_a, chunk=8)[0]

    g = torch.Generator().manual_seed(0)
    q, k, log_a = (torch.randn(2, 3, 24, 4, generator=g) for _ in range(3))
    v, mild = torch.randn(2, 3, 24, 5, generator=g), -log_a.sigmoid()
    ep = torch.export.export(Mixer(), (q, k, v, mild))
    for log_a in (mild, mild * 40):  # a chunk's total log-decay under / over the factorised form's limit (60)
        torch.testing.assert_close(ep.module()(q, k, v, log_a), gla_recurrent(q, k, v, log_a)[0], rtol=1e-4,
                                   atol=1e-5)


def test_bad_runtime_and_format():
    model = zoo.create('vgg_tiny')
    with pytest.raises(ValueError, match=r"unknown runtime 'onnx'.*eager, compile, onnxruntime, openvino"):
        zoo.optimize(model, 'onnx')
    with pytest.raises(ValueError, match=r"unknown export format 'tflite'; expected one of onnx, pt2"):
        zoo.export(model, 'x.tflite', example_input('vgg_tiny'), format='tflite')
    with pytest.raises(ValueError, match='nms=True needs a detector'):
        zoo.export(model, 'x.onnx', example_input('vgg_tiny'), nms=True)
    with pytest.raises(ValueError, match='float32 only'):
        zoo.optimize(model, 'onnxruntime', dtype=torch.bfloat16)


_RESNET_BACKBONE = {'backbone': 'resnet_tiny', 'backbone_kwargs': {'stem': 'imagenet'}}


def test_compile_gives_each_model_its_own_graphs():
    """zoo.optimize gives every model a compiled frame of its own: models sharing one forward never share the
    frame's recompile limit (8 by default, 1 here), which would otherwise leave every model after the limit
    silently running eager."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=1):
        # two families sharing ClassifierBase.forward, two dense models sharing forward_raw; the cheapest to
        # compile of each (the dense ones on a ResNet backbone): the frames are the point, not the networks
        for name, kwargs in (('vgg_tiny', {}), ('resnet_tiny', {}), ('semfpn_seg_tiny', _RESNET_BACKBONE),
                             ('yolo_det_tiny', _RESNET_BACKBONE)):
            before = counters['stats']['unique_graphs']
            model = zoo.create(name, **kwargs).eval()
            x = example_input(name, 2)
            fast = zoo.optimize(model, 'compile', example=x)
            assert counters['stats']['unique_graphs'] > before, f'{name} was not compiled'
            with torch.no_grad():
                assert _rel(model_output(fast, x), model_output(model, x)) <= REL
    torch._dynamo.reset()


def test_compile_serves_a_second_batch_size_of_a_one_channel_metaformer():
    """A compiled model called at a second batch size compiles a second static graph and matches eager.
    Dynamo's automatic dynamic shapes once compiled it batch-symbolic, and inductor's frozen convolution then
    failed on a 1-channel input ("expected size 16==16, stride 1==64"; torch 2.14): the 7 MetaFormer mixers on
    digits had no compiled batch-16 latency in paper_blocks. One stage is enough to show it (~11 s)."""
    import torch._dynamo
    from zoo.metaformer import MetaFormer
    torch._dynamo.reset()
    model = MetaFormer(depths=(1,), dims=(16,), num_classes=10, in_chans=1, img_size=32).eval()
    fast = zoo.optimize(model, 'compile', example=torch.randn(1, 1, 32, 32))
    with torch.no_grad():
        for batch in (1, 3):
            x = torch.randn(batch, 1, 32, 32)
            assert _rel(fast(x), model(x)) <= REL, batch
    torch._dynamo.reset()


def test_compile_reuses_one_graph_in_every_grad_mode():
    """A compiled model called plainly, under no_grad, under inference_mode, and on a tensor made under
    inference_mode runs the graph compiled by ``optimize(example=...)``: dynamo guards on the input's dispatch
    keys, which the grad mode changes, and each of these calls once compiled a graph of its own (a user's ``with
    torch.inference_mode(): y = fast(x)`` paid a second compilation)."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    model = zoo.create('vgg_tiny').eval()
    x = example_input('vgg_tiny', 2)
    before = counters['stats']['unique_graphs']
    fast = zoo.optimize(model, 'compile', example=x)
    assert counters['stats']['unique_graphs'] == before + 1
    with torch.no_grad():
        expected = model(x)
    with torch.inference_mode():
        made_inside = x.clone()
    outs = [fast(x)]
    with torch.no_grad():
        outs.append(fast(x))
    with torch.inference_mode():
        outs += [fast(x), fast(made_inside)]
    assert counters['stats']['unique_graphs'] == before + 1, 'a grad mode compiled a graph of its own'
    for out in outs:
        assert _rel(out, expected) <= REL
    assert not outs[2].is_inference()  # usable outside inference_mode, as eager's no_grad output is
    torch._dynamo.reset()


def test_bf16_detector_predicts_in_float32():
    """A detector optimised with ``dtype=torch.bfloat16`` runs its network under autocast and decodes the bfloat16
    maps with the head's float32 weights (``zoo bench yolo_det --dtype bfloat16`` failed: input type BFloat16
    and weight type Float)."""
    model = zoo.create('yolo_det_tiny').eval()
    x = example_input('yolo_det_tiny', 2)
    fast = zoo.optimize(model, 'eager', dtype=torch.bfloat16)
    assert fast.forward_raw(x)[0].dtype == torch.bfloat16
    dets, ref = fast(x), model(x)
    assert len(dets) == len(ref) == 2 and all(d.keys() == r.keys() for d, r in zip(dets, ref))


def test_compile_freezes_the_weights():
    """``zoo.optimize(..., 'compile')`` promises inductor's freezing: the weights are folded into the graph as
    constants (``_frozen_param``), not passed as inputs. Asked for through ``torch.compile(options=...)`` alone,
    freezing is silently ignored (torch 2.14), and every convolution ran unpacked."""
    from torch._inductor.utils import run_and_get_code
    model = zoo.create('poolformer_tiny').eval()
    x = example_input('poolformer_tiny', 2)
    fast = zoo.optimize(model, 'compile')
    with torch.no_grad():
        out, code = run_and_get_code(fast, x)
        assert _rel(out, model(x)) <= REL
    code = '\n'.join(code)
    assert '_frozen_param' in code and 'def call(self, args)' in code
    call_args = code.split('def call(self, args)')[1].splitlines()[1]
    assert len(re.findall(r'arg\d+_1', call_args)) == 1, call_args      # the input alone: no weight is an argument


def test_compiled_calls_check_the_input_alone():
    """Dynamo checks the input's guards, not the model's modules and parameters, at every call (freezing already
    makes each graph a snapshot of the weights): 75 us a call for raftmlp_tiny, 0.25-0.55 ms for RaftMLP-S at
    batch 1 (docs/runtimes.md). So a graph compiled before a change to the model does not see it: optimize again."""
    model = zoo.create('poolformer_tiny', num_classes=4).eval()
    x2, x3 = example_input('poolformer_tiny', 2), example_input('poolformer_tiny', 3, seed=1)
    fast = zoo.optimize(model, 'compile', example=x2)
    with torch.no_grad():
        before = [fast(x2), fast(x3)]  # the input's guards stay: batch 3 compiles a graph of its own
        assert _rel(before[1], model(x3)) <= REL and before[1].shape == (3, 4)
        model.head = torch.nn.Identity()  # with guards on the modules, the next calls recompiled (features out)
        assert all(torch.equal(fast(x), b) for x, b in zip((x2, x3), before))


class _TokenMLP(torch.nn.Module):
    """Linear -> exact GELU -> Linear on (B, T, C) tokens: the channel MLP of RaftMLP, TNT, Strip-MLP."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(24, 96), torch.nn.GELU(), torch.nn.Linear(96, 24)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _compiled_code(model, x):
    from torch._inductor.utils import run_and_get_code
    with torch.no_grad():
        out, code = run_and_get_code(zoo.optimize(model, 'compile'), x)
        assert _rel(out, model(x)) <= REL
    return '\n'.join(code)


@pytest.mark.skipif(not (torch.backends.mkldnn.is_available() and torch._C.has_mkl), reason='needs MKL and oneDNN')
def test_compile_runs_frozen_float32_linears_in_onednn_with_the_gelu_fused(monkeypatch):
    """With a static batch, inductor's freezing packs a float32 linear for MKL (``mkl._mkl_linear``); zoo's pass
    (``zoo.layers.onednn.compiled_linear_pass``) runs it in oneDNN over the N-d tokens, bias and GELU fused (the
    compiled RaftMLP-S, TNT-S, Strip-MLP-T* 1.04-1.30x faster on the AMD EPYC machine, docs/runtimes.md).
    ``ZOO_ONEDNN=0`` keeps inductor's own choice; a user's post-grad pass still runs; a failed first-use
    self-test leaves the graph to MKL."""
    from torch._inductor import config as inductor_config
    from torch._inductor.custom_graph_pass import CustomGraphPass
    from zoo.layers import onednn

    model, x = _TokenMLP().eval(), torch.randn(4, 10, 24)
    code = _compiled_code(model, x)
    calls = re.findall(r"= torch\.ops\.mkldnn\._linear_pointwise\.default\([^\n]*?, '(\w+)', \[", code)  # attr
    assert 'mkl._mkl_linear' not in code and calls == ['gelu', 'none'], calls  # fc1 with its GELU fused, fc2

    monkeypatch.setenv('ZOO_ONEDNN', '0')
    code = _compiled_code(model, x)
    assert 'mkl._mkl_linear' in code and 'mkldnn._linear_pointwise' not in code
    monkeypatch.delenv('ZOO_ONEDNN')

    class Seen(CustomGraphPass):
        calls = 0

        def __call__(self, graph):
            Seen.calls += 1

        def uuid(self):
            return 'test-seen'
    with inductor_config.patch(post_grad_custom_pre_pass=Seen()):  # (monkeypatch's undo deletes config entries)
        code = _compiled_code(model, x)
    assert Seen.calls == 1 and 'mkl._mkl_linear' not in code

    # timm's TNT: the rewritten linears' weights once carried symbolic sizes into dynamo's guards (IndexError)
    from timm.models.tnt import TNT
    tnt = TNT(img_size=32, patch_size=16, embed_dim=48, inner_dim=12, depth=1, num_heads_inner=2,
              num_heads_outer=2, num_classes=10).eval()
    assert 'mkldnn._linear_pointwise' in _compiled_code(tnt, torch.randn(2, 3, 32, 32))

    monkeypatch.setitem(onednn._CHECKED, ('compiled linear', torch.float32), False)   # as after a mismatch
    code = _compiled_code(model, x)
    assert 'mkl._mkl_linear' in code and 'mkldnn._linear_pointwise' not in code
