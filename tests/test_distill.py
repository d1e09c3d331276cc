"""Knowledge distillation (recipes/distill.py): the losses against a hand computation, the feature adapter's shapes,
the teacher frozen and out of the optimizer / EMA / checkpoint, short fits of the classification and detection
recipes with a teacher the test trains nothing for (its weights are saved to tmp_path), the results database's
record of the teacher, and the one-line errors for bad input."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from conftest import one_error_line
import zoo
from zoo.recipes.distill import Distiller, FeatureAdapter, feature_loss, file_sha256, hard_loss, logit_loss
from zoo.recipes.main import main

ROOT = Path(__file__).resolve().parents[1]
KD = ROOT / 'recipes' / 'configs' / 'distill' / 'resnet_tiny_shapes_kd_10e.yaml'
DET = ROOT / 'recipes' / 'configs' / 'detection' / 'yolo_det_tiny_shapes_det_128.yaml'
QUIET = ['--trainer.enable_progress_bar', 'false', '--trainer.enable_model_summary', 'false']
WIDE = dict(conv_layer='standard', widths=[32, 64, 128, 256])  # the recipe's teacher


@pytest.fixture(scope='module')
def teacher(tmp_path_factory) -> str:
    """The recipe's teacher architecture with random weights, as a state dict file (6 shapes classes)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp('teacher') / 'teacher.pth'
    torch.save(zoo.create('resnet_tiny', num_classes=6, **WIDE).state_dict(), path)
    return str(path)


@pytest.fixture
def quiet_runs(runs, tmp_path, monkeypatch):
    monkeypatch.setenv('ZOO_RECORD_LATENCY', '0')
    monkeypatch.setenv('ZOO_DB', str(tmp_path / 'results.db'))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny steps: two threads on a shared 2-core machine only wait on each other
    yield runs
    torch.set_num_threads(threads)


def _softmax(row):
    e = [math.exp(v - max(row)) for v in row]
    return [v / sum(e) for v in e]


S = [[1.0, 2.0, 3.0], [0.5, -1.0, 0.0]]
T = [[3.0, 1.0, 0.0], [1.0, 2.0, -0.5]]


def test_logit_loss_is_hintons_kl_times_t_squared():
    temp = 2.0
    by_hand = 0.0
    for s, t in zip(S, T):
        ps, pt = _softmax([v / temp for v in s]), _softmax([v / temp for v in t])
        by_hand += sum(q * (math.log(q) - math.log(p)) for p, q in zip(ps, pt))
    by_hand = by_hand / len(S) * temp ** 2
    got = logit_loss(torch.tensor(S), torch.tensor(T), temp)
    assert got.item() == pytest.approx(by_hand, rel=1e-6)
    assert logit_loss(torch.tensor(T), torch.tensor(T), temp).item() == pytest.approx(0.0, abs=1e-7)


def test_hard_loss_is_cross_entropy_on_the_teachers_argmax():
    # the teacher's argmax: class 0 for the first row, class 1 for the second
    by_hand = -(math.log(_softmax(S[0])[0]) + math.log(_softmax(S[1])[1])) / 2
    assert hard_loss(torch.tensor(S), torch.tensor(T)).item() == pytest.approx(by_hand, rel=1e-6)


def test_feature_adapter_maps_channels_and_resizes_to_the_teacher():
    adapter = FeatureAdapter(16, 64)
    out = adapter(torch.randn(2, 16, 8, 8), (4, 4))
    assert out.shape == (2, 64, 4, 4) and adapter.proj.kernel_size == (1, 1)
    teacher = torch.randn(2, 64, 4, 4)
    loss = feature_loss(adapter, torch.randn(2, 16, 8, 8, requires_grad=True), teacher)
    loss.backward()
    assert loss.item() > 0 and adapter.proj.weight.grad is not None


def test_distiller_sizes_the_adapter_from_both_models(teacher):
    student = zoo.create('resnet_tiny', num_classes=6, conv_layer='standard')
    for level, (s_chs, t_chs) in ((-1, (128, 256)), (1, (32, 64))):
        d = Distiller(dict(teacher='resnet_tiny', checkpoint=teacher, kind='feature', level=level, model_args=WIDE),
                      student, {'num_classes': 6, 'img_size': 32}, 'classification')
        assert (d.adapter.proj.in_channels, d.adapter.proj.out_channels) == (s_chs, t_chs)
        assert d.checkpoint_sha256 == file_sha256(teacher) and len(d.checkpoint_sha256) == 16


def test_teacher_is_frozen_and_out_of_optimizer_ema_and_state_dict(teacher):
    from zoo.recipes import ImageClassifier

    system = ImageClassifier('resnet_tiny', num_classes=6, img_size=32, model_args={'conv_layer': 'standard'},
                             ema_decay=0.99, lr_scheduler=None,
                             distill={'teacher': 'resnet_tiny', 'checkpoint': teacher, 'kind': 'feature',
                                      'model_args': WIDE})
    t = system.distiller.teacher
    system.train()
    assert not t.training and not any(p.requires_grad for p in t.parameters())
    teacher_ids = {id(p) for p in t.parameters()}
    opt = system.configure_optimizers()
    in_opt = {id(p) for g in opt.param_groups for p in g['params']}
    assert not in_opt & teacher_ids
    assert {id(p) for p in system.distiller.adapter.parameters()} <= in_opt  # the adapter trains
    assert {id(p) for p in system.model.parameters()} <= in_opt
    assert not {id(p) for p in system.ema.module.parameters()} & teacher_ids
    keys = system.state_dict().keys()
    assert not [k for k in keys if 'teacher' in k]
    assert {k.split('.')[0] for k in keys} <= {'model', 'ema', 'distiller'}
    assert sum(k.startswith('distiller.') for k in keys) == 2  # the adapter's weight and bias only
    # the teacher's weights are the file's: loaded strictly
    sd = torch.load(teacher, weights_only=True)
    assert all(torch.equal(v, sd[k]) for k, v in t.state_dict().items())
    assert system.hparams['distill']['checkpoint_sha256'] == file_sha256(teacher)


def test_classification_fit_records_the_teacher(teacher, quiet_runs, tmp_path):
    from zoo.eval import results

    for kind in ('logit', 'feature'):
        assert main(['fit', '-c', str(KD), '--model.distill.checkpoint', teacher, '--model.distill.kind', kind,
                     '--trainer.max_epochs', '1', '--trainer.limit_train_batches', '2',
                     '--trainer.limit_val_batches', '1', '--trainer.log_every_n_steps', '1',
                     '--data.num_samples', '400', *QUIET]) == 0
    db = str(tmp_path / 'results.db')
    runs = results.runs(db=db).sort_values('id')
    assert list(runs.status) == ['finished', 'finished']
    for (_, row), kind in zip(runs.iterrows(), ('logit', 'feature')):
        distill = row.hparams['distill']
        assert distill['teacher'] == 'resnet_tiny' and distill['kind'] == kind
        assert distill['checkpoint_sha256'] == file_sha256(teacher)
        rows = results.metrics(int(row.id), db=db)
        names = set(rows.name)
        assert {'teacher/val_acc1', 'train/kd_loss', 'train/task_loss'} <= names
        acc = rows[rows.name == 'teacher/val_acc1'].value.iloc[0]
        assert 0.0 <= acc <= 1.0
    results.close_all()


def test_detection_fast_dev_run_with_feature_and_logit_distillation(quiet_runs, tmp_path):
    path = tmp_path / 'det_teacher.pth'
    torch.save(zoo.create('yolo_det_tiny', num_classes=6).state_dict(), path)  # shapes_det's 6 classes
    small = ['--data.img_size', '64', '--data.num_samples', '40', '--data.batch_size', '4', '--data.min_px', '8',
             '--data.max_px', '24']
    assert main(['fit', '-c', str(DET), '--model.distill',
                 f'{{teacher: yolo_det_tiny, checkpoint: {path}, kind: feature, level: 0}}',
                 '--trainer.fast_dev_run', 'true', *small, *QUIET]) == 0
    assert main(['fit', '-c', str(DET), '--model.distill', f'{{teacher: yolo_det_tiny, checkpoint: {path}}}',
                 '--trainer.fast_dev_run', 'true', *small, *QUIET]) == 0  # logit: the class scores per anchor
    assert main(['fit', '-c', str(DET), '--model.distill',
                 f'{{teacher: yolo_det_tiny, checkpoint: {path}, kind: hard}}',
                 '--trainer.fast_dev_run', 'true', *small, *QUIET]) == 2  # hard labels: classification only


def test_dense_logit_loss_by_hand():
    """Two anchors on one level, 4 box bins per side (16 box channels) then 2 classes: BCE(sigmoid(s/T) against
    sigmoid(t/T)) summed over classes, averaged over the anchors, times T^2; the box channels are not read."""
    from zoo.recipes.distill import dense_logit_loss

    s_cls = torch.tensor([[[0.5, -1.0], [2.0, 0.0]]])    # (B=1, nc=2, A=2)
    t_cls = torch.tensor([[[1.0, -2.0], [1.0, 1.0]]])
    temp = 2.0
    student = [torch.cat([torch.randn(1, 16, 1, 2), s_cls.view(1, 2, 1, 2)], 1)]
    teacher = [torch.cat([torch.zeros(1, 16, 1, 2), t_cls.view(1, 2, 1, 2)], 1)]
    p, q = torch.sigmoid(t_cls / temp), torch.sigmoid(s_cls / temp)
    by_hand = -(p * q.log() + (1 - p) * (1 - q).log()).sum(1).mean() * temp ** 2
    assert dense_logit_loss(student, teacher, 2, temp).item() == pytest.approx(by_hand.item(), rel=1e-6)
    with pytest.raises(ValueError, match='different anchors'):
        dense_logit_loss(student, [teacher[0][..., :1]], 2, temp)


@pytest.mark.parametrize('args, expected', [
    (['--model.distill.teacher', 'resnet_tiyn'], "distill.teacher: no model named 'resnet_tiyn'. Did you mean "
                                                 "'resnet_tiny'"),  # close matches
    (['--model.distill.checkpoint', '/nonexistent/teacher.ckpt'], 'distill.checkpoint: no file /nonexistent/'),
    (['--model.distill.kind', 'logits'], 'did you mean logit'),
    (['--model.distill.kind', 'feature', '--model.distill.level', '7'], 'distill.level 7: the student resnet_tiny'
                                                                        ' has 4 feature levels (-4..3)'),
    (['--model.distill.teacher', 'yolo_det_tiny'], 'yolo_det_tiny is a detection model'),
])
def test_bad_distill_input_is_one_line(args, expected, teacher, quiet_runs, capfd):
    assert main(['fit', '-c', str(KD), '--model.distill.checkpoint', teacher, *args,
                 '--trainer.fast_dev_run', 'true', *QUIET]) == 2
    line = one_error_line(capfd)
    assert line.startswith('zoo fit: error: ') and expected in line, line
    assert not quiet_runs.exists()


def test_a_seed_fixes_the_students_init_and_the_random_state_with_or_without_a_teacher(teacher):
    """Paired seeds: building the teacher (and the adapter) draws nothing from the global random state."""
    from zoo.recipes import ImageClassifier

    args = dict(num_classes=6, img_size=32, model_args={'conv_layer': 'standard'}, lr_scheduler=None)
    out = []
    for distill in (None, {'teacher': 'resnet_tiny', 'checkpoint': teacher, 'kind': 'feature', 'model_args': WIDE}):
        torch.manual_seed(3)
        system = ImageClassifier('resnet_tiny', distill=distill, **args)
        out.append((system.model.state_dict(), torch.rand(4)))
    (plain, after_plain), (kd, after_kd) = out
    assert all(torch.equal(plain[k], kd[k]) for k in plain) and torch.equal(after_plain, after_kd)
