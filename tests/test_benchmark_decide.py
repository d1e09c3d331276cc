"""Issue 43 wired end to end: the benchmark file's claims (paired, effect, margin, not_tested), ``seeds: {min, max}``,
the sequential seed rule and the convergence gate as the runner and the report use them (``benchmark_claims``),
non-inferiority (``'>='``), and a tiny benchmark run through the command line that adds a seed to an undecided
claim and stops at the cap. The statistics themselves are tested in tests/test_decide.py."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from zoo.eval import results as R
from zoo.eval.results import decide
from zoo.recipes import benchmark_claims as BC
from zoo.recipes.benchmark_spec import BenchmarkError, load
from zoo.recipes.main import main

from test_benchmark import FAST, SMALL, zoo

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.xdist_group(__name__)


def spec(tmp: Path, claims, seeds=None, **group) -> Path:
    g = {'task': 'classification', 'dataset': 'digits', 'recipe': 'poolformer/poolformer_tiny_digits_15e',
         'overrides': {**FAST, 'trainer.max_epochs': 2}, 'batch_sizes': [1],
         'entries': {e: {'model.model_args': {'token_mixer': e, **SMALL}} for e in ('pooling', 'identity')},
         'claims': claims, **group}
    if seeds is not None:
        g['seeds'] = seeds
    path = tmp / 'benchmarks' / 'seq.yaml'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({'groups': {'mixers': g}}, sort_keys=False))
    return path


# ------------------------------------------------------------------------------------------- the file
def test_claims_and_seeds_parse(tmp_path):
    b = load(str(spec(tmp_path, [
        {'claim': 'c1', 'compare': '>', 'entries': ['pooling', 'identity'], 'effect': 0.1, 'paired': True},
        {'claim': 'c2', 'compare': '>=', 'entries': ['pooling', 'identity'], 'margin': 0.02},
        {'claim': 'c3', 'not_tested': 'needs ImageNet-pretrained backbones'}], seeds={'min': 3, 'max': 5})))
    g = b.groups['mixers']
    assert g.seeds == (0, 1, 2) and g.max_seeds == 5 and g.seed_cap() == 5
    c1, c2, c3 = g.claims
    assert (c1.effect, c1.paired, c1.margin) == (0.1, True, None)
    assert (c2.compare, c2.margin, c2.paired) == ('>=', 0.02, False)
    assert c3.not_tested and not c3.entries
    assert len(b.jobs()) == 6 and len(b.possible_jobs()) == 10          # seeds 3 and 4 only if the rule adds them
    assert {j.seed for j in b.possible_jobs()} == {0, 1, 2, 3, 4}


@pytest.mark.parametrize('claim, seeds, message', [
    ({'claim': 'c', 'compare': '~', 'entries': ['pooling', 'identity']}, None, "needs margin"),
    ({'claim': 'c', 'compare': '~', 'entries': ['pooling', 'identity'], 'margin': 0.1, 'effect': 0.1}, None,
     'takes margin'),
    ({'claim': 'c', 'compare': '>', 'entries': ['pooling', 'identity'], 'margin': 0.1}, None, 'takes effect'),
    ({'claim': 'c', 'compare': '>', 'entries': ['pooling', 'identity'], 'effect': -1}, None, 'effect must be'),
    ({'claim': 'c', 'compare': '>', 'entries': ['pooling', 'identity'], 'paired': 'yes'}, None, 'paired must be'),
    ({'claim': 'c', 'not_tested': 'why', 'entries': ['pooling', 'identity']}, None, 'compares nothing'),
    ({'claim': 'c', 'compare': '>', 'entries': ['pooling', 'identity'], 'tolerance': 0.1}, None, 'unknown key'),
    ({'claim': 'c', 'compare': '>', 'entries': ['pooling', 'identity']}, {'min': 1, 'max': 3}, '2 <= M <= N'),
    ({'claim': 'c', 'compare': '>', 'entries': ['pooling', 'identity']}, {'min': 3, 'max': 2}, '2 <= M <= N'),
    ({'claim': 'c', 'compare': '>', 'entries': ['pooling', 'identity']}, {'min': 3, 'mx': 5}, "did you mean max"),
])
def test_bad_claims_and_seeds_are_one_line_errors(tmp_path, claim, seeds, message):
    path = spec(tmp_path, [claim], seeds=seeds)
    with pytest.raises(BenchmarkError, match=message) as e:
        load(str(path))
    assert '\n' not in str(e.value)


def test_across_needs_a_reference_entry(tmp_path):
    path = spec(tmp_path, [])
    raw = yaml.safe_load(path.read_text())
    raw['across'] = {'all': {'groups': ['mixers'], 'reference': 'polling'}}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(BenchmarkError, match="did you mean pooling"):
        load(str(path))
    raw['across'] = {'all': ['mixers']}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(BenchmarkError, match='reference'):
        load(str(path))


def test_group_selection_keeps_what_it_fine_tunes_from(capsys):
    from zoo.recipes.benchmark import only_groups

    b = load(str(ROOT / 'benchmarks' / 'paper_blocks.yaml'))
    assert list(only_groups(b, ['convbn_finetune']).groups) == ['resnet_shapes', 'convbn_finetune']
    with pytest.raises(BenchmarkError, match='did you mean canon_copy'):
        only_groups(b, ['canon_cpy'])
    assert main(['benchmark', 'run', 'paper_blocks', '--group', 'canon_cpy', '--dry-run']) == 2
    assert 'did you mean canon_copy' in capsys.readouterr().err
    assert main(['benchmark', 'report', 'paper_blocks', '--group', 'canon_copy']) == 2     # never a partial page
    assert "writes the whole file's page" in capsys.readouterr().err
    assert list(only_groups(b.fresh_seeds(), ['canon_copy']).groups) == ['canon_copy']


# ------------------------------------------------------------------------------------------- non-inferiority
def test_non_inferiority_by_hand():
    """'>=' with margin 0.02 on paired differences d = (0.01, 0.03, 0.02): mean 0.02, sd 0.01, se 0.01/sqrt(3),
    t(0.975, 2) = 4.3027: interval 0.02 -/+ 0.02484 = [-0.00484, 0.04484], above -0.02: holds. Shifted by -0.05:
    [-0.05484, -0.00516], crossing -0.02: inconclusive; by -0.1: [-0.1048, -0.0552], below -0.02: does not hold."""
    d = [0.01, 0.03, 0.02]
    v = decide.verdict(d, direction='>=', margin=0.02, paired=True)
    assert v.verdict == decide.HOLDS
    assert v.low == pytest.approx(0.02 - 4.302653 * 0.01 / math.sqrt(3), abs=1e-6)
    assert decide.verdict([x - 0.05 for x in d], direction='>=', margin=0.02, paired=True).verdict \
        == decide.INCONCLUSIVE
    assert decide.verdict([x - 0.1 for x in d], direction='>=', margin=0.02, paired=True).verdict == decide.FAILS
    # p of H0 d <= -margin: t = (0.02 + 0.02) / (0.01 / sqrt 3) = 6.928 on 2 df -> 0.0101
    assert v.p == pytest.approx(0.0101, abs=2e-4)
    with pytest.raises(ValueError, match='margin'):
        decide.verdict(d, direction='>=', paired=True)


# ------------------------------------------------------------------------------------------- the seed rule
def _result(group, verdict, gate=None, entries=('a', 'b')):
    from zoo.recipes.benchmark_spec import Claim
    return BC.ClaimResult(group, Claim('c', 'val/acc1', '>', entries), raw=verdict, gate=gate)


def test_seeds_to_add_pairs_the_next_seed_and_stops_at_the_cap(tmp_path):
    """An inconclusive claim gets one more seed, the same on both entries (the next above any seed either has);
    a decided claim, an undertrained one and one at the cap get none."""
    b = load(str(spec(tmp_path, [{'claim': 'c', 'compare': '>', 'entries': ['pooling', 'identity']}],
                      seeds={'min': 2, 'max': 4})))
    g = b.groups['mixers']
    open_ = decide.verdict([0.1, -0.1, 0.05], direction='>', paired=True)
    shut = decide.verdict([0.1, 0.11, 0.12], direction='>', paired=True)
    assert open_.verdict == decide.INCONCLUSIVE and shut.verdict == decide.HOLDS
    pair = ('pooling', 'identity')
    tried = {('mixers', 'pooling'): {0, 1, 2}, ('mixers', 'identity'): {0, 1}}
    assert BC.seeds_to_add(b, [_result(g, open_, entries=pair)], tried) == [('mixers', 'pooling', 3),
                                                                             ('mixers', 'identity', 3)]
    assert BC.seeds_to_add(b, [_result(g, shut, entries=pair)], tried) == []
    assert BC.seeds_to_add(b, [_result(g, open_, gate='pooling seed 0: still improving', entries=pair)], tried) == []
    full = {k: {0, 1, 2, 3} for k in tried}
    assert BC.seeds_to_add(b, [_result(g, open_, entries=pair)], full) == []


def test_the_gate_blocks_a_claim_whose_entry_still_improves(tmp_path):
    """decide_claims on a database written by hand: the curve 0.5, 0.9 of one seed is still rising by more than
    the claim interval's half-width, so the claim is "undertrained", gets no Holm verdict and no seeds."""
    db = tmp_path / 'r.db'
    store = R.open_db(str(db))
    b = load(str(spec(tmp_path, [{'claim': 'c', 'compare': '>', 'entries': ['pooling', 'identity'],
                                  'paired': True}], seeds={'min': 3, 'max': 4})))
    curves = {('pooling', 0): [0.5, 0.90], ('pooling', 1): [0.89, 0.90], ('pooling', 2): [0.90, 0.91],
              ('identity', 0): [0.6, 0.6], ('identity', 1): [0.61, 0.61], ('identity', 2): [0.6, 0.62]}
    _write_runs(store, b, curves)
    df = BC.current(b, R.data(db=store, status=None), store)
    assert len(df) == 6
    (r,) = BC.decide_claims(b, df, store)
    assert r.status == BC.UNDERTRAINED and 'pooling seed 0: still improving' in r.gate
    assert r.adjusted is None and BC.seeds_to_add(b, [r], {}) == []
    R.close_all()


# ------------------------------------------------------------------------------------------- end to end
def test_the_runner_adds_a_seed_to_an_undecided_claim_and_stops_at_the_cap(tmp_path, monkeypatch, capsys):
    """Two mixers, seeds {min: 2, max: 3}, a claim no seed count here decides (validation losses equal within
    1e-9; they differ by about 1e-7 from seed to seed) at learning rate 0, so every curve is flat bit for bit and
    passes the convergence gate:
    4 jobs, then one more seed for both entries, then the cap; a second invocation runs nothing; the report says
    inconclusive at 3 seeds and how many the spread would need."""
    spec(tmp_path, [{'claim': 'pooling equals identity', 'compare': '~', 'margin': 1e-9, 'paired': True,
                     'metric': 'val/loss', 'entries': ['pooling', 'identity']}], seeds={'min': 2, 'max': 3},
         # a learning rate that moves nothing: flat curves pass the convergence gate, the seeds' inits differ
         overrides={**FAST, 'trainer.max_epochs': 2, 'model.optimizer.init_args.lr': 0.0})
    out = zoo('benchmark', 'run', 'seq', '--no-latency', cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert '4 to run' in out.stderr and 'adding seed 2' in out.stderr and '6 finished' in out.stderr, out.stderr
    assert out.stderr.count('adding seed') == 2                    # one line per entry, then the cap
    db = tmp_path / 'benchmarks' / 'seq.db'
    R.close_all()
    df = R.data(db=str(db), status=None)
    assert sorted(zip(df.entry, df.seed)) == [(e, s) for e in ('identity', 'pooling') for s in (0, 1, 2)]
    R.close_all()
    again = zoo('benchmark', 'run', 'seq', '--no-latency', cwd=tmp_path)
    assert again.returncode == 0 and '0 to run' in again.stderr and 'adding seed' not in again.stderr, again.stderr
    monkeypatch.chdir(tmp_path)
    assert main(['benchmark', 'report', 'seq']) == 0
    R.close_all()
    text = (tmp_path / 'docs' / 'benchmarks' / 'seq.md').read_text()
    row = next(line for line in text.splitlines() if 'pooling equals identity' in line and 'paired by seed' in line)
    summary = next(line for line in text.splitlines() if line.startswith('| pooling equals identity |'))
    assert '| pooling ~ identity | inconclusive |' in summary and 'val/loss, n=3' in summary, summary
    assert '| inconclusive' in row and '3 of 3' in row and 'paired by seed' in row, row
    assert '| ~' in row, row                                        # the seeds the spread would need
    assert '](seq/mixers_time.svg)' in text and (tmp_path / 'docs' / 'benchmarks' / 'seq' / 'mixers_time.svg').exists()
    assert text.count('--seeds 0,1,2`') == 2, text                 # each row's re-run command: the seeds it holds
    assert 'Trained on ' in text                                    # and the CPU that trained them


def _write_runs(store, b, values: dict, group: str = 'mixers') -> None:
    """One finished run per (entry, seed) with its curve of val/acc1 (the last value is also the final one)."""
    for (entry, seed), curve in values.items():
        job = b.job(group, entry, seed)
        rid = store.start_run('metaformer_tiny', task='classification', dataset=b.groups[group].dataset, seed=seed,
                              hparams={'benchmark': {'name': b.name, 'group': group, 'entry': entry,
                                                     'key': job.key}})
        for i, v in enumerate(curve):
            store.log_metrics(rid, {'val/acc1': v}, epoch=i, step=i)
        store.log_metrics(rid, {'val/acc1': curve[-1]}, final=True)
        store.finish_run(rid)


def test_recheck_decides_the_claims_again_on_fresh_seeds(tmp_path):
    """``recheck: {seeds_from: 100, groups: [...]}``: ``fresh_seeds()`` moves the groups' seeds to 100.., their
    jobs get other keys (the main tables never count them), and the report's stability table sets the verdict
    on seeds 0-2 (pooling 0.90/0.91/0.92 vs identity 0.60/0.62/0.61: holds) beside the one on seeds 100-102
    (0.80/0.82/0.81 vs 0.60/0.61/0.59: holds too)."""
    from zoo.recipes.benchmark_report import decided_summary, stability_rows, stability_section, stability_summary

    path = spec(tmp_path, [{'claim': 'pooling beats identity', 'compare': '>', 'entries': ['pooling', 'identity'],
                            'paired': True}], seeds={'min': 3, 'max': 4})
    raw = yaml.safe_load(path.read_text())
    raw['recheck'] = {'seeds_from': 100, 'groups': ['mixers']}
    path.write_text(yaml.safe_dump(raw))
    b = load(str(path))
    fresh = b.fresh_seeds()
    assert fresh.groups['mixers'].seeds == (100, 101, 102)
    assert not {j.key for j in fresh.possible_jobs()} & {j.key for j in b.possible_jobs()}
    store = R.open_db(str(tmp_path / 'r.db'))
    main_runs = {('pooling', s): [v, v] for s, v in zip((0, 1, 2), (0.90, 0.91, 0.92))}
    main_runs |= {('identity', s): [v, v] for s, v in zip((0, 1, 2), (0.60, 0.62, 0.61))}
    fresh_runs = {('pooling', s): [v, v] for s, v in zip((100, 101, 102), (0.80, 0.82, 0.81))}
    fresh_runs |= {('identity', s): [v, v] for s, v in zip((100, 101, 102), (0.60, 0.61, 0.59))}
    _write_runs(store, b, {**main_runs, **fresh_runs})
    df = R.data(db=store, status=None)
    assert len(BC.current(b, df, store)) == 6 and len(BC.current(fresh, df, store)) == 6
    claims = BC.decide_claims(b, BC.current(b, df, store), store)
    assert [r.status for r in claims] == [decide.HOLDS]
    assert decided_summary(claims) == ("Decided: 1 of the 1 claims (1 after Holm's correction across the page); 0 not "
                                       'testable on a CPU, 0 still open or undertrained.')
    rows = stability_rows(b, BC.current(fresh, df, store), store, claims)
    text = '\n'.join(stability_section(b, rows))
    row = next(line for line in text.splitlines() if 'pooling beats identity' in line)
    assert row.count('| holds |') == 2 and row.rstrip().endswith('| yes |'), row
    assert '0.3000 [' in row and '0.2100 [' in row, row              # the two paired mean differences
    # the front page's sentence counts the decided claims re-run and names those that changed
    assert stability_summary(b, rows, claims) == ('Re-decided on fresh seeds (100, 101, ...): 1 of the 1 decided '
                                                  'claims re-run gave the same verdict (pooling beats identity).')
    rows[0].update({'seeds 100.. verdict': 'inconclusive', 'same': 'no'})
    assert stability_summary(b, rows, claims).endswith(
        '0 of the 1 decided claims re-run gave the same verdict; not the same: pooling beats identity: holds, then '
        'inconclusive.')
    R.close_all()


@pytest.mark.parametrize('recheck, message', [
    ({'seeds_from': 1, 'groups': ['mixers']}, 'overlaps'),
    ({'seeds_from': 100, 'groups': ['mixer']}, 'did you mean mixers'),
    ({'seeds_from': 0, 'groups': ['mixers']}, 'seeds_from: N >= 1'),
])
def test_bad_recheck_sections(tmp_path, recheck, message):
    path = spec(tmp_path, [], seeds={'min': 3, 'max': 4})
    raw = yaml.safe_load(path.read_text())
    raw['recheck'] = recheck
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(BenchmarkError, match=message):
        load(str(path))


def test_across_tables_are_relative_to_the_reference_entry(tmp_path):
    """Two groups at different levels (digits around 0.9, shapes around 0.5): every entry's mean over the
    reference's mean per group, then the mean over groups; the 6 runs pooled get a percentile bootstrap.
    By hand: pooling 0.90/0.91/0.92 over identity's mean 0.61 = 1.4918; on shapes 0.55/0.56/0.57 over 0.50 =
    1.12; mean over groups 1.3059."""
    from zoo.recipes.benchmark_report import across_table

    path = spec(tmp_path, [], seeds=[0, 1, 2])
    raw = yaml.safe_load(path.read_text())
    raw['groups']['shapes'] = {**raw['groups']['mixers'], 'dataset': 'shapes'}
    raw['across'] = {'both': {'groups': ['mixers', 'shapes'], 'reference': 'identity'}}
    path.write_text(yaml.safe_dump(raw))
    b = load(str(path))
    store = R.open_db(str(tmp_path / 'r.db'))
    _write_runs(store, b, {('pooling', s): [v] for s, v in zip((0, 1, 2), (0.90, 0.91, 0.92))}
                | {('identity', s): [v] for s, v in zip((0, 1, 2), (0.60, 0.61, 0.62))})
    _write_runs(store, b, {('pooling', s): [v] for s, v in zip((0, 1, 2), (0.55, 0.56, 0.57))}
                | {('identity', s): [0.5] for s in (0, 1, 2)}, group='shapes')
    df = BC.current(b, R.data(db=store, status=None), store)
    rows = across_table(b, 'both', df)
    assert [r['entry'] for r in rows] == ['pooling', 'identity']
    assert rows[0]['mixers (x identity)'] == '1.492' and rows[0]['shapes (x identity)'] == '1.120'
    assert rows[0]['mean over groups'] == '1.306' and rows[1]['mean over groups'] == '1.000'
    lo, hi = (float(x) for x in rows[0]['95 % bootstrap (6 runs)'].strip('[]').split(', '))
    assert 1.09 < lo < 1.306 < hi < 1.51
    R.close_all()


def test_a_difference_of_bounded_metrics_is_shown_inside_its_range():
    """Item 8 (no interval outside the metric's range) for claims too: a - b of two accuracies lies in [-1, 1], so
    a paired t-interval of three seeds that reaches past it (canon's copy probe on fresh seeds: 0.80 [0.52, 1.08])
    is shown at the bound; an unbounded metric (PSNR) keeps its ends."""
    from types import SimpleNamespace

    from zoo.recipes.benchmark_report import difference_ends

    v = SimpleNamespace(low=0.5205, high=1.0782)
    assert difference_ends('val/acc', v) == (0.5205, 1.0)
    assert difference_ends('val/miou', SimpleNamespace(low=-1.2, high=-0.1)) == (-1.0, -0.1)
    assert difference_ends('val/psnr', v) == (0.5205, 1.0782)
