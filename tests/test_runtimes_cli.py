"""Runtimes from the command line (issue 26): ``zoo bench --runtime``, ``zoo export``, ``zoo test --runtime
onnxruntime``, ``zoo fit --compile`` and bf16-mixed on the CPU, ``zoo profile``. Tiny models, 2-3 repeats;
no wall-clock figure is asserted."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import zoo
from zoo.recipes.main import main

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / 'recipes' / 'configs' / 'poolformer' / 'poolformer_tiny_digits_15e.yaml'
QUIET = ['--trainer.enable_progress_bar', 'false', '--trainer.enable_model_summary', 'false']
FAST = ['--repeats', '2', '--warmup', '1', '--time', '0']


def _json_rows(out: str):
    return json.loads(out[out.index('\n[') + 1:] if not out.startswith('[') else out)


# ------------------------------------------------------------------------------------------------- zoo fit
def test_fit_compiles_the_network_in_the_system_and_bf16_mixed_trains_on_the_cpu(runs, capsys):
    """``--model.compile eager`` captures the forward with dynamo (the 'eager' backend: no inductor build, so the
    test takes seconds; ``--compile`` is inductor); bf16-mixed autocasts the classification step on the CPU."""
    from zoo.recipes.classification import ImageClassifier

    system = ImageClassifier('poolformer_tiny', num_classes=10, in_chans=1, img_size=28, compile='eager')
    eager = system.model(torch.randn(2, 1, 28, 28)).shape
    system.configure_model()
    assert system.model._compiled_call_impl is not None                  # compiled in place: keys unchanged
    assert set(system.state_dict()) == set(ImageClassifier('poolformer_tiny', num_classes=10, in_chans=1,
                                                           img_size=28).state_dict())
    assert system.model(torch.randn(2, 1, 28, 28)).shape == eager
    for extra in (['--model.compile', 'eager'], ['--trainer.precision', 'bf16-mixed']):
        assert main(['fit', '-c', str(DEMO), '--trainer.fast_dev_run', 'true', *extra, *QUIET]) == 0, extra
    # the top-level flag is the system's argument
    capsys.readouterr()
    assert main(['fit', '-c', str(DEMO), '--compile', '--print_config']) == 0
    assert 'compile: true' in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------- zoo profile
@pytest.mark.parametrize('name', ['poolformer_tiny', 'tnt_tiny', 'mamba_yolo_tiny'])
def test_profile_splits_time_and_macs_by_block_kind(name, capsys):
    from zoo.eval import breakdown
    from zoo.eval.profile import count_macs, example_input

    model = zoo.create(name).eval()
    x = example_input(model, zoo.model_info(name).input_size, 1)
    res = breakdown.profile_kinds(model, x, repeats=2, warmup=1)
    kinds = {r['kind']: r for r in res['rows']}
    assert sum(r['macs'] for r in res['rows']) == pytest.approx(count_macs(model, example=x), rel=0.01)
    assert all(r['ms'] > 0 for r in res['rows'])                       # every kind present shows its time
    assert sum(r['ms'] for r in res['rows']) == pytest.approx(res['total_ms'], rel=1e-6)
    assert {'token_mixer', 'norm'} <= set(kinds) or {'conv', 'norm'} <= set(kinds)
    assert kinds['token_mixer']['modules'] > 0 if 'token_mixer' in kinds else True

    assert main(['profile', name, '--repeats', '2', '--warmup', '1', '--json']) == 0
    out = capsys.readouterr().out
    data = json.loads(out[out.index('\n{') + 1:])
    assert data['total_macs'] == res['total_macs'] and 'block kind' in out


def test_profile_does_not_count_warm_up_calls():
    """The timing hooks are attached after the warm-up: each block of a PoolFormer runs once per forward, so it
    is timed exactly ``repeats`` times whatever the warm-up."""
    from zoo.eval import breakdown

    model = zoo.create('poolformer_tiny').eval()
    x = torch.randn(1, *zoo.model_info('poolformer_tiny').input_size)
    res = breakdown.profile_kinds(model, x, repeats=2, warmup=3)
    assert res['calls'] and set(res['calls'].values()) == {2}
    assert res['calls']['stem'] == 2 and not any(h for m in model.modules() for h in m._forward_hooks.values())
