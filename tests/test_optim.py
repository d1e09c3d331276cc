"""recipes/optim.py: the one parameter-group builder and the one warm-up/cosine schedule, and that every recipe
builds its optimizer through them (issue 13 item 7: a model's ``no_weight_decay()`` is honoured)."""
from __future__ import annotations

import functools

import types

import pytest
import torch

import zoo
from zoo.recipes import optim


def _decay_of(opt: torch.optim.Optimizer, model) -> dict[str, float]:
    by_id = {id(p): g['weight_decay'] for g in opt.param_groups for p in g['params']}
    return {n: by_id[id(p)] for n, p in model.named_parameters() if id(p) in by_id}


def _optimizer(system, steps: int = 10):
    system._trainer = types.SimpleNamespace(estimated_stepping_batches=steps, max_epochs=1, max_steps=steps)
    out = system.configure_optimizers()
    return out['optimizer'] if isinstance(out, dict) else out


def test_warmup_cosine():
    lrs = [optim.warmup_cosine(s, 100, 10, 0.01) for s in range(101)]
    assert lrs[0] == pytest.approx(1 / 11) and lrs[10] == pytest.approx(1.0) and max(lrs) == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:11])) and all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[100] == pytest.approx(0.01) and optim.warmup_cosine(500, 100, 10, 0.01) == pytest.approx(0.01)
    assert optim.warmup_cosine(50, 100) == pytest.approx(0.5)  # no warm-up: half way down at half way


@pytest.mark.parametrize('warmup_steps', [None, 0])
def test_warmup_cosine_scheduler_takes_the_epochs_when_no_steps_are_given(warmup_steps):
    """A config's saved ``warmup_steps: 0`` (the parser's value for "unset") must not cut ``warmup_epochs`` to a step."""
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.004)
    sched = optim.WarmupCosine(opt, warmup_epochs=1, warmup_steps=warmup_steps)
    sched.bind(types.SimpleNamespace(max_steps=-1, estimated_stepping_batches=500, max_epochs=5))
    assert sched.warmup == 100 and opt.param_groups[0]['lr'] == pytest.approx(0.004 / 101)
    assert optim.WarmupCosine(opt, warmup_steps=7).bind(types.SimpleNamespace(max_steps=50)).warmup == 7


def test_tnt_position_embeddings_and_class_token_get_no_weight_decay():
    """The optimizer ImageClassifier builds for TNT: pos embeddings and the class token at weight_decay 0."""
    system = zoo.recipes.ImageClassifier('tnt_tiny', num_classes=3,
                                         optimizer=functools.partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.05))
    decay = _decay_of(_optimizer(system), system.model)
    assert {n: decay[n] for n in ('word_pos', 'sentence_pos', 'cls_token')} == dict.fromkeys(
        ('word_pos', 'sentence_pos', 'cls_token'), 0.0)
    assert all(decay[n] == 0.0 for n, p in system.model.named_parameters() if p.ndim <= 1)
    matrices = [n for n, p in system.model.named_parameters() if p.ndim > 1 and n not in system.model.no_weight_decay()]
    assert matrices and all(decay[n] == 0.05 for n in matrices)


def test_finetune_layer_decay_keeps_the_no_decay_names(tmp_path):
    torch.save(zoo.create('tnt_tiny', num_classes=5).state_dict(), tmp_path / 'tnt.pth')
    system = zoo.recipes.FineTuner('tnt_tiny', str(tmp_path / 'tnt.pth'), num_classes=3, layer_decay=0.7,
                                   optimizer=functools.partial(torch.optim.AdamW, lr=1e-4, weight_decay=0.05))
    decay = _decay_of(_optimizer(system), system.model)
    assert decay['cls_token'] == decay['word_pos'] == 0.0 and decay['head.weight'] == 0.05


@pytest.mark.parametrize('make', [
    lambda: zoo.recipes.CausalLM('llama_tiny', vocab_size=32),  # its default AdamW: weight decay 0.03
    lambda: zoo.recipes.Denoiser('dncnn_tiny', optimizer=functools.partial(torch.optim.Adam, lr=1e-3, weight_decay=0.01)),
], ids=['lm', 'denoising'])
def test_every_recipe_builds_its_groups_through_optim(make, monkeypatch):
    """A name the model declares in ``no_weight_decay()`` gets weight decay 0 in every recipe's optimizer."""
    system = make()
    name = next(n for n, p in system.model.named_parameters() if p.ndim > 1)
    monkeypatch.setattr(system.model, 'no_weight_decay', lambda: {name}, raising=False)
    decay = _decay_of(_optimizer(system), system.model)
    assert decay[name] == 0.0 and any(v > 0 for v in decay.values())
    assert all(decay[n] == 0.0 for n, p in system.model.named_parameters() if p.ndim <= 1)
