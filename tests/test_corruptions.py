"""Corruptions (ImageNet-C style), ``zoo test --corruptions``, calibration error and the reliability diagram."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zoo.datasets.corruptions import (CIFAR_C, CORRUPTIONS, IMAGENET_C, CorruptedDataset, corrupt,
                                      parse_corruptions, parse_severities)

from zoo_cli import error_line, zoo_in_process

RECIPE = 'poolformer/poolformer_tiny_digits_15e'
QUICK = ['--trainer.enable_progress_bar=false', '--trainer.enable_model_summary=false']


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Small images: one thread (conftest's ``one_thread``), no OpenMP barriers per tiny convolution."""


@pytest.fixture(scope='module')
def astronaut():
    """scikit-image's astronaut, area-downsampled to 64 px (RGB in [0, 1])."""
    from skimage.data import astronaut
    image = torch.as_tensor(astronaut()).permute(2, 0, 1).float() / 255  # (H, W, 3) -> (3, H, W)
    return F.interpolate(image[None], size=(64, 64), mode='area')[0]


def _rms(a, b) -> float:
    return float((a - b).pow(2).mean().sqrt())


def test_tables_cover_every_corruption_at_five_severities():
    for table in (IMAGENET_C, CIFAR_C):
        assert set(table) == set(CORRUPTIONS)
        assert all(len(v) == 5 for v in table.values())


@pytest.mark.parametrize('size', [32, 64])
@pytest.mark.parametrize('name', sorted(CORRUPTIONS))
def test_deterministic_and_worse_with_severity(astronaut, name, size):
    x = F.interpolate(astronaut[None], size=(size, size), mode='area')[0]
    outs = [corrupt(x, name, s, seed=3, index=7) for s in range(1, 6)]
    for s, out in enumerate(outs, 1):
        assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
        assert torch.equal(out, corrupt(x.clone(), name, s, seed=3, index=7))  # same (seed, index): same image
    if name == 'pixelate':
        # resampling to a size that does not divide the image shifts pixels, so the distance to the clean image is
        # not monotonic between neighbouring severities (in ImageNet-C either); the resolution left is
        rows = [len(torch.unique(o[0], dim=0)) for o in outs]
        assert all(a > b for a, b in zip(rows, rows[1:])), rows
    else:
        dist = [_rms(o, x) for o in outs]
        assert 0 < dist[0] and all(a < b for a, b in zip(dist, dist[1:])), dist


def test_seeded_by_seed_and_index_not_by_order(astronaut):
    x = astronaut[:, :32, :32]
    a = corrupt(x, 'gaussian_noise', 3, seed=0, index=1)
    assert not torch.equal(a, corrupt(x, 'gaussian_noise', 3, seed=0, index=2))
    assert not torch.equal(a, corrupt(x, 'gaussian_noise', 3, seed=1, index=1))
    # a dataset wrapper: item i is the same whether read first or last, and undoes the normalisation exactly
    mean, std = 0.5, 0.25
    images = torch.stack([x, x.flip(-1), x.flip(-2)])
    base = list(zip((images - mean) / std, torch.tensor([0, 1, 2])))
    ds = CorruptedDataset(base, 'shot_noise', 2, mean, std, seed=5)
    forward = [ds[i][0] for i in range(3)]
    backward = [ds[i][0] for i in reversed(range(3))][::-1]
    assert all(torch.equal(a, b) for a, b in zip(forward, backward))
    expected = (corrupt(images[2], 'shot_noise', 2, seed=5, index=2) - mean) / std
    assert torch.allclose(forward[2], expected, atol=1e-5) and ds[2][1] == 2


@pytest.mark.parametrize('module', ['DigitsDataModule', 'ShapesDataModule'])
def test_datamodule_mean_std_recover_pixels(module):
    import zoo.datasets
    dm = getattr(zoo.datasets, module)(num_samples=60, batch_size=8) if module == 'ShapesDataModule' \
        else getattr(zoo.datasets, module)()
    dm.setup('test')
    x = torch.stack([dm.test_set[i][0] for i in range(min(16, len(dm.test_set)))])
    pixels = x * torch.as_tensor(dm.std).reshape(-1, 1, 1) + torch.as_tensor(dm.mean).reshape(-1, 1, 1)
    assert pixels.min() >= -1e-4 and pixels.max() <= 1 + 1e-4 and pixels.max() > 0.9
    dm.test_corruptions = (('fog', 1), ('contrast', 5))
    loaders = dm.test_dataloader()
    assert len(loaders) == 3 and len(loaders[2].dataset) == len(dm.test_set)


def test_names_and_severities():
    assert parse_corruptions('noise,fog') == ('gaussian_noise', 'shot_noise', 'impulse_noise', 'speckle_noise', 'fog')
    assert parse_corruptions(None) == tuple(CORRUPTIONS)
    assert parse_severities('5,1') == (5, 1)
    with pytest.raises(ValueError, match="unknown corruption 'fgo'; did you mean fog"):
        parse_corruptions('fgo')
    with pytest.raises(ValueError, match='from 1 to 5'):
        parse_severities('0')


# ---------------------------------------------------------------------------------------------- calibration
def _ece(logits, target, n_bins):
    from torchmetrics.classification import MulticlassCalibrationError
    return float(MulticlassCalibrationError(logits.shape[1], n_bins=n_bins, norm='l1')(logits, target))


def test_ece_bins_match_torchmetrics():
    from zoo.recipes.robustness import calibration_bins

    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(300, 7, generator=g) * 3, torch.randint(0, 7, (300,), generator=g)
    conf, pred = logits.softmax(-1).max(-1)
    count, acc, mean_conf = calibration_bins(conf, pred == target, 15)
    ours = float((count / count.sum() * (acc - mean_conf).abs()).sum())
    assert ours == pytest.approx(_ece(logits, target, 15), abs=1e-6)


def test_ece_by_hand_two_bins():
    # top-1 confidences 0.9, 0.8, 0.6 (bin [0.5, 1]: 2 of 3 right) and 0.4, 0.45 (bin [0, 0.5): 1 of 2 right)
    probs = torch.tensor([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1], [0.6, 0.3, 0.1], [0.4, 0.35, 0.25], [0.45, 0.3, 0.25]])
    target = torch.tensor([0, 1, 1, 0, 2])
    high = abs(2 / 3 - (0.9 + 0.8 + 0.6) / 3) * 3 / 5   # 0.1 * 3/5 = 0.06
    low = abs(1 / 2 - (0.4 + 0.45) / 2) * 2 / 5         # 0.075 * 2/5 = 0.03
    assert _ece(probs, target, 2) == pytest.approx(high + low, abs=1e-6) == pytest.approx(0.09)


def test_directions_of_the_new_metrics():
    from zoo.eval.results import is_higher_better
    assert not is_higher_better('test/ece') and not is_higher_better('val/ece')
    assert not is_higher_better('test_c/mce') and not is_higher_better('test_c/ce')
    assert is_higher_better('test_c/acc1/fog/3') and is_higher_better('test_c/acc1')


def test_a_benchmark_group_ranks_by_mce(tmp_path):
    from zoo.recipes.benchmark_report import _higher
    from zoo.recipes.benchmark_spec import load

    spec = tmp_path / 'robust.yaml'
    spec.write_text(f'groups:\n  digits:\n    task: classification\n    recipe: {RECIPE}\n    metric: test_c/mce\n'
                    '    entries: {pooling: {}}\n')
    group = load(str(spec)).groups['digits']
    assert group.metric == 'test_c/mce' and _higher(group.metric) is False


# ------------------------------------------------------------------------------------------------ end to end
@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A PoolFormer-tiny digits run of two training batches, in a folder of its own."""
    cwd = tmp_path_factory.mktemp('robust')
    fit = zoo_in_process('fit', '-c', RECIPE, '--trainer.max_epochs=1', '--trainer.limit_train_batches=2',
                         '--trainer.limit_val_batches=1', *QUICK, cwd=cwd)
    assert fit.returncode == 0, fit.stderr[-2000:]
    return cwd


def test_zoo_test_corruptions_records_and_plots(trained):
    from zoo.eval import results

    args = ('test', '-c', RECIPE, '--ckpt_path', 'best', '--trainer.limit_test_batches=2', *QUICK,
            '--corruptions', 'gaussian_noise,fog', '--severities', '1,3')
    first = zoo_in_process(*args, cwd=trained)
    assert first.returncode == 0, first.stderr[-2000:]
    assert 'no --corruptions-reference' in first.stderr and 'fog' in first.stdout
    df = results.data(str(trained / 'zoo-results.db'))
    row = df[df['test_c/ce'].notna()].iloc[-1]
    accs = [row[f'test_c/acc1/{c}/{s}'] for c in ('gaussian_noise', 'fog') for s in (1, 3)]
    assert all(0 <= a <= 1 for a in accs)
    assert row['test_c/acc1'] == pytest.approx(sum(accs) / 4, abs=1e-6)
    assert row['test_c/ce'] == pytest.approx(1 - row['test_c/acc1'], abs=1e-6)
    assert 0 <= row['test/ece'] <= 1 and row['test/acc1'] == row['test/acc1']  # clean metrics beside them
    runs = sorted((trained / 'runs' / 'poolformer_tiny_digits_15e').glob('2*'))
    png = runs[-1] / 'reliability.png'
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    # the same checkpoint as its own reference: the corruptions are seeded, so every ratio is exactly 1
    second = zoo_in_process(*args, '--corruptions-reference', str(int(row['run_id'])), cwd=trained)
    assert second.returncode == 0, second.stderr[-2000:]
    df = results.data(str(trained / 'zoo-results.db'))
    assert df['test_c/mce'].dropna().tolist() == [pytest.approx(1.0)]


@pytest.mark.parametrize('args, expected', [
    (['test', '-c', RECIPE, '--corruptions', 'gausian_noise'],
     "zoo test: error: unknown corruption 'gausian_noise'; did you mean gaussian_noise"),
    (['test', '-c', RECIPE, '--corruptions', 'fog', '--severities', '6'],
     'zoo test: error: severities must be comma-separated integers from 1 to 5'),
    (['fit', '-c', RECIPE, '--corruptions'], 'zoo fit: error: --corruptions is for zoo test'),
    (['test', '-c', RECIPE, '--severities', '1'], 'zoo test: error: --severities and --corruptions-reference go '
                                                  'with --corruptions'),
])
def test_bad_corruption_arguments(args, expected, tmp_path):
    proc = zoo_in_process(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert error_line(proc).startswith(expected)
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / 'runs').exists()


def test_a_reference_without_those_corruptions_is_refused(trained):
    proc = zoo_in_process('test', '-c', RECIPE, '--ckpt_path', 'best', '--corruptions', 'contrast',
                          '--corruptions-reference', RECIPE, *QUICK, cwd=trained)
    assert proc.returncode == 2
    assert 'recorded every corruption and severity asked for' in error_line(proc)
