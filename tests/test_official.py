"""``zoo bench --vs official:SOURCE[:CALLABLE]`` (eval/official.py): the official implementation as the reference.

CI has no network, so the "official" modules here are the independent re-statements in tests/reference_*.py,
behind the official constructors' signatures. On the development machine the same path was run against the
fetched official code (okojoalg/raft-mlp ``libs/models.py: RaftMLP``, Med-Process/Strip_MLP
``models/strip_mlp.py: StripMLPNet``; see docs/mlp.md).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from zoo.eval import bench
from zoo.recipes.main import main

TESTS = Path(__file__).parent
RAFT = f'official:{TESTS / "reference_raftmlp.py"}:RaftMLP'
STRIP = f'official:{TESTS / "reference_stripmlp.py"}:StripMLPNet'


@pytest.mark.parametrize('name, spec', [('raftmlp_tiny', RAFT), ('stripmlp_tiny', STRIP)])
def test_bench_takes_the_official_implementation_as_reference(name, spec):
    rows = bench.run([name], vs=spec, batch_sizes=(1, 2), repeats=1, warmup=0)
    ours = [r for r in rows if r['model'] == name]
    ref = [r for r in rows if r['model'] == spec]
    assert [r['batch_size'] for r in ours] == [1, 2] and len(ref) == 2
    assert all(r['speedup'] > 0 and r['vs'] == spec for r in ours)
    assert ours[0]['max_abs_diff'] < 1e-5
    assert ours[0]['params'] == ref[0]['params']


def test_bench_vs_official_on_the_command_line(capsys):
    rc = main(['bench', 'stripmlp_tiny', '--vs', STRIP, '--repeats', '1', '--warmup', '0', '--mode', 'train',
               '--batch-size', '2', '--json'])
    assert rc == 0
    out = capsys.readouterr().out
    rows = json.loads(out[out.index('['):])
    assert {r['model'] for r in rows} == {'stripmlp_tiny', STRIP}
    assert all(r['mode'] == 'train' for r in rows)


def test_the_module_name_form_and_the_default_callable(monkeypatch):
    from zoo.eval.official import build_official
    import zoo
    monkeypatch.syspath_prepend(str(TESTS))
    model = zoo.create('raftmlp_tiny').eval()
    official = build_official('official:reference_raftmlp', model)  # the official class name RaftMLP by default
    assert type(official).__name__ == 'OfficialRaftMLP'


@pytest.mark.parametrize('argv, message', [
    (['bench', 'poolformer_s12', '--vs', RAFT], 'available for the families raftmlp, stripmlp'),
    (['bench', 'raftmlp_tiny', '--vs', 'official:/nonexistent/models.py'], 'not found: /nonexistent/models.py'),
    (['bench', 'raftmlp_tiny', '--vs', 'official:no_such_module_xyz'], "could not import"),
    (['bench', 'raftmlp_tiny', '--vs', RAFT.replace(':RaftMLP', ':Missing')], "has no 'Missing'"),
    (['bench', 'raftmlp_tiny', '--vs', STRIP], 'could not be built as raftmlp_tiny'),
])
def test_bad_official_references_are_clear_errors(argv, message, capsys):
    assert main(argv + ['--repeats', '1', '--warmup', '0']) == 2
    assert message in capsys.readouterr().err


def test_an_official_model_with_other_keys_or_other_logits_is_refused(tmp_path, capsys):
    (tmp_path / 'other_keys.py').write_text('from torch import nn\n\ndef RaftMLP(**kwargs):\n'
                                            '    return nn.Linear(2, 2)\n')
    (tmp_path / 'other_logits.py').write_text(
        'import sys\nsys.path.insert(0, %r)\nfrom reference_raftmlp import RaftMLP as _R\n\n'
        'def RaftMLP(**kwargs):\n    m = _R(**kwargs)\n    f = m.forward\n    m.forward = lambda x: f(x) + 1\n'
        '    return m\n' % str(TESTS))
    assert main(['bench', 'raftmlp_tiny', '--vs', f'official:{tmp_path / "other_keys.py"}']) == 2
    assert 'does not take raftmlp_tiny' in capsys.readouterr().err
    assert main(['bench', 'raftmlp_tiny', '--vs', f'official:{tmp_path / "other_logits.py"}']) == 2
    assert 'gives other logits' in capsys.readouterr().err


@pytest.mark.parametrize('family, body', [
    # the official GRN is the identity while its gamma and beta are 0 (their initial values)
    ('stripmlp', ('from reference_stripmlp import GRN, StripMLPNet as _S\n\n'
                  'def StripMLPNet(**kwargs):\n    m = _S(**kwargs)\n'
                  '    for g in m.modules():\n        if isinstance(g, GRN):\n            g.forward = lambda x: x\n'
                  '    return m\n')),
    # a LayerNorm whose affine part is dropped is the same while its weight is 1 and its bias 0
    ('raftmlp', ('from torch import nn\nfrom reference_raftmlp import RaftMLP as _R\n\n'
                 'def RaftMLP(**kwargs):\n    m = _R(**kwargs)\n'
                 '    for n in m.modules():\n        if isinstance(n, nn.LayerNorm):\n'
                 '            n.forward = lambda x, n=n: nn.functional.layer_norm(x, n.normalized_shape, eps=n.eps)\n'
                 '    return m\n')),
])
def test_a_difference_hidden_by_initial_weights_is_found(family, body, tmp_path):
    """The check runs with every weight and statistic perturbed first: with the initial values these official
    models give our logits exactly, yet they are not the same network."""
    from zoo.eval.official import build_official, perturbed
    import zoo

    (tmp_path / 'models.py').write_text(f'import sys\nsys.path.insert(0, {str(TESTS)!r})\n' + body)
    model = zoo.create(f'{family}_tiny').eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="perturbed weights gives other logits"):
        build_official(f'official:{tmp_path / "models.py"}', model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())   # our weights are restored
    # the perturbation moves every floating tensor (constant ones too), keeps variances positive and counters
    moved = perturbed(before)
    assert all(not torch.equal(moved[k], v) for k, v in before.items() if v.is_floating_point())
    assert all(moved[k].min() > 0 for k in before if k.endswith('running_var'))
    assert all(torch.equal(moved[k], v) for k, v in before.items() if not v.is_floating_point())


def test_the_official_model_ends_with_our_own_weights():
    from zoo.eval.official import build_official
    import zoo

    model = zoo.create('stripmlp_tiny').eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    official = build_official(STRIP, model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    x = torch.randn(2, *zoo.model_info('stripmlp_tiny').input_size)
    with torch.inference_mode():
        assert (model(x) - official(x)).abs().max() < 1e-5


def test_two_checkouts_with_the_same_module_names_are_not_confused(tmp_path, capsys):
    """Official repositories reuse names (``models/...``, ``libs/models.py``): the file named is the one used,
    not a module of that name imported earlier in the process from another checkout."""
    from zoo.eval.official import import_source

    for repo, extra in (('a', ''), ('b', 'OTHER = True\n')):
        (tmp_path / repo / 'libs').mkdir(parents=True)
        (tmp_path / repo / 'libs' / '__init__.py').write_text('')
        (tmp_path / repo / 'libs' / 'consts.py').write_text(f'WHO = {repo!r}\n')
        (tmp_path / repo / 'libs' / 'models.py').write_text(
            f'import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom libs.consts import WHO\n'
            'from reference_raftmlp import RaftMLP\n' + extra)
    a = import_source(str(tmp_path / 'a' / 'libs' / 'models.py'))
    b = import_source(str(tmp_path / 'b' / 'libs' / 'models.py'))
    assert (a.WHO, b.WHO, hasattr(a, 'OTHER'), hasattr(b, 'OTHER')) == ('a', 'b', False, True)
    assert import_source(str(tmp_path / 'a' / 'libs' / 'models.py')).WHO == 'a'   # and back
