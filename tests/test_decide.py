"""``zoo.eval.results.decide``, the statistics that decide a benchmark's claims (issue 43), on synthetic numbers
whose answers are worked out by hand in the comments (t quantiles from tables; with 2 degrees of freedom the
Student-t CDF has the closed form F(t) = 1/2 + t / (2 sqrt(t^2 + 2)), which gives the p-values exactly)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from zoo.eval.results.decide import (FAILS, HOLDS, INCONCLUSIVE, SMALLER, bootstrap_interval, bounded_interval,
                                     holm, next_seeds, normalised, paired_difference, seeds_needed, undertrained,
                                     verdict)
from zoo.eval.results.stats import bootstrap_ci, t_interval

T2 = 4.302653   # t(0.975, 2)
T4 = 2.776445   # t(0.975, 4)


def sf2(t: float) -> float:
    """P(T_2 >= t), closed form."""
    return 0.5 - t / (2 * math.sqrt(t * t + 2))


def three(mean: float, sd: float) -> list[float]:
    """Three values with this mean and sample sd: mean + (-1, 0, 1) sd (the squared deviations sum to 2 sd^2)."""
    return [mean - sd, mean, mean + sd]


# ------------------------------------------------------------------------------------------- paired seeds
def test_paired_difference_matches_seeds_and_drops_nans_pairwise():
    # seed 3 has a NaN on a, seeds 4 and 5 are on one side only: pairs 0, 1, 2 with d = 0.5, 1.0, 0.5.
    # mean 2/3; deviations -1/6, 1/3, -1/6 -> sd = sqrt((1/36 + 1/9 + 1/36) / 2) = sqrt(1/12) = 0.288675;
    # half-width t(0.975, 2) sd / sqrt(3) = 4.302653 * 0.166667 = 0.717109.
    d = paired_difference({0: 1.0, 1: 2.0, 2: 3.5, 3: math.nan, 5: 9.0}, {0: 0.5, 1: 1.0, 2: 3.0, 3: 1.0, 4: 2.0})
    assert d.seeds == (0, 1, 2) and d.n == 3
    assert d.diffs == pytest.approx((0.5, 1.0, 0.5))
    assert d.mean == pytest.approx(2 / 3) and d.sd == pytest.approx(math.sqrt(1 / 12))
    assert (d.low, d.high) == pytest.approx((2 / 3 - T2 * math.sqrt(1 / 36), 2 / 3 + T2 * math.sqrt(1 / 36)))
    # the Welch interval of the same six values, as scipy computes it
    welch = stats.ttest_ind([1.0, 2.0, 3.5], [0.5, 1.0, 3.0], equal_var=False).confidence_interval(0.95)
    assert (d.welch_low, d.welch_high) == pytest.approx((welch.low, welch.high))
    # sequences with their seed lists pair the same way, in a's order
    s = paired_difference([3.5, 1.0, 2.0], [1.0, 0.5, 3.0], seeds_a=[2, 0, 1], seeds_b=[1, 0, 2])
    assert s.seeds == (2, 0, 1) and s.diffs == pytest.approx((0.5, 0.5, 1.0))


@pytest.mark.parametrize('call, message', [
    (lambda: paired_difference([1, 2], [1, 2]), 'seeds_a'),
    (lambda: paired_difference([1, 2], [1, 2], seeds_a=[0, 0], seeds_b=[0, 1]), 'seed(s) 0 given twice'),
    (lambda: paired_difference([1, 2, 3], {0: 1}, seeds_a=[0, 1]), '3 values but 2 seeds'),
])
def test_paired_difference_refuses_values_it_cannot_pair(call, message):
    with pytest.raises(ValueError, match='^[^\n]*$') as e:
        call()
    assert message in str(e.value)


def test_the_paired_interval_decides_where_the_unpaired_one_does_not():
    # Five seeds share a base that varies by seed (0.60 ... 0.80) and a gains 0.008-0.012 on every one of them.
    # Paired: d = 0.010, 0.012, 0.008, 0.011, 0.009 -> mean 0.010, sd = sqrt((0 + 4 + 4 + 1 + 1) e-6 / 4)
    # = 0.00158114, half-width t(0.975, 4) sd / sqrt(5) = 2.776445 * 0.000707107 = 0.00196324: [0.00804, 0.01196],
    # 0 excluded -> holds. Unpaired, the seeds' spread (sd about 0.079 per side) swamps the gain: Welch's
    # interval is about +/- 0.11 -> inconclusive.
    base = np.array([0.60, 0.70, 0.80, 0.65, 0.75])
    gain = np.array([0.010, 0.012, 0.008, 0.011, 0.009])
    d = paired_difference(list(base + gain), list(base), seeds_a=range(5), seeds_b=range(5))
    paired = verdict(d, direction='>', paired=True)
    assert (paired.low, paired.high) == pytest.approx((0.010 - T4 * 0.000707107, 0.010 + T4 * 0.000707107),
                                                      rel=1e-5)
    assert (paired.low, paired.high) == pytest.approx((d.low, d.high))
    assert paired.verdict == HOLDS and paired.n == 5
    unpaired = verdict(d, direction='>', paired=False)
    assert unpaired.verdict == INCONCLUSIVE
    assert (unpaired.low, unpaired.high) == pytest.approx((d.welch_low, d.welch_high))
    assert unpaired.low < -0.1 and unpaired.high > 0.1
    # the same two samples given directly, and the paired one as per-seed differences, decide the same way
    assert verdict((base + gain, base), direction='>', paired=False).verdict == INCONCLUSIVE
    assert verdict(gain, direction='>', paired=True).verdict == HOLDS
    # the p-values are scipy's one-sided paired and Welch t-tests
    assert paired.p == pytest.approx(stats.ttest_rel(base + gain, base, alternative='greater').pvalue)
    assert unpaired.p == pytest.approx(stats.ttest_ind(base + gain, base, equal_var=False,
                                                       alternative='greater').pvalue)


# ------------------------------------------------------------------------------------------- verdicts
# Differences mean + (-1, 0, 1) sqrt(3): sd sqrt(3), se 1, df 2, so the 95 % interval is mean +/- 4.302653.
@pytest.mark.parametrize('mean, effect, expected, why', [
    (5.0, 3.0, HOLDS, "holds the paper's 3"),                      # [0.70, 9.30]: excludes 0, holds 3
    (5.0, 0.1, HOLDS, "above the paper's 0.1"),                    # a larger gain than the paper's
    (5.0, None, HOLDS, 'excludes 0'),
    (5.0, 10.0, SMALLER, 'a real gain, smaller'),                  # excludes 0 AND lies wholly below 10
    (1.0, 6.0, SMALLER, 'no gain shown'),                          # [-3.30, 5.30]: holds 0, excludes 6
    (-5.0, 3.0, FAILS, 'wholly against'),                          # [-9.30, -0.70]
    (1.0, 4.0, INCONCLUSIVE, "holds 0 and the paper's 4"),        # holds both 0 and 4
])
def test_four_verdicts_against_the_papers_effect(mean, effect, expected, why):
    v = verdict(three(mean, math.sqrt(3)), direction='>', effect=effect, paired=True)
    assert (v.low, v.high) == pytest.approx((mean - T2, mean + T2))
    assert v.verdict == expected and why in v.why
    assert v.p == pytest.approx(sf2(mean))        # one-sided p of "a > b": P(T_2 >= mean / se)
    # a '<' claim on the mirrored differences is the same decision
    mirrored = verdict([-x for x in three(mean, math.sqrt(3))], direction='<', effect=effect, paired=True)
    assert mirrored.verdict == expected and mirrored.p == pytest.approx(v.p)


def test_directional_p_value_closed_form():
    # mean 5, se 1, df 2: p = 1/2 - 5 / (2 sqrt(27)) = 0.5 * (1 - 0.962250) = 0.018875
    assert verdict(three(5, math.sqrt(3)), direction='>', paired=True).p == pytest.approx(0.018875, abs=1e-6)


def test_equality_claims_are_decided_by_tost():
    # Differences 0.01 + (-1, 0, 1) 0.01 sqrt(3): se 0.01, df 2, interval 0.01 +/- 0.0430265 = [-0.0330, 0.0530].
    v = verdict(three(0.01, 0.01 * math.sqrt(3)), direction='~', margin=0.1, paired=True)
    # inside +/- 0.1: equivalent. p_low = P(T_2 >= (0.01 + 0.1)/0.01 = 11) = 1/2 - 11/(2 sqrt 123) = 0.0040817;
    # p_high = P(T_2 <= (0.01 - 0.1)/0.01 = -9) = 1/2 - 9/(2 sqrt 83) = 0.0060608; Holm's p is the larger.
    assert v.verdict == HOLDS
    assert (v.p_low, v.p_high) == pytest.approx((0.0040817, 0.0060608), abs=1e-7)
    assert v.p == v.p_high and 'TOST' in v.why
    # margin 0.03: the interval crosses +/- 0.03 -> inconclusive (p_high = 1/2 - 2/(2 sqrt 6) = 0.091752)
    narrow = verdict(three(0.01, 0.01 * math.sqrt(3)), direction='~', margin=0.03, paired=True)
    assert narrow.verdict == INCONCLUSIVE and narrow.p == pytest.approx(0.091752, abs=1e-6)
    # mean 0.2: [0.157, 0.243] lies wholly outside +/- 0.1 -> does not hold
    far = verdict(three(0.2, 0.01 * math.sqrt(3)), direction='~', margin=0.1, paired=True)
    assert far.verdict == FAILS
    # unpaired TOST: both sides have mean 0.915 and variance 0.0005/3, so se = sqrt(2 * 0.0005/3 / 4) = 0.0091287,
    # df = 6, interval 0 +/- 2.446912 * 0.0091287 = +/- 0.022337, inside +/- 0.03; each one-sided p is scipy's
    # Welch test against the shifted null.
    a, b = np.array([0.90, 0.93, 0.91, 0.92]), np.array([0.91, 0.90, 0.92, 0.93])
    u = verdict((a, b), direction='~', margin=0.03, paired=False)
    assert (u.low, u.high) == pytest.approx((-0.022337, 0.022337), abs=1e-6) and u.verdict == HOLDS
    assert u.p_low == pytest.approx(stats.ttest_ind(a + 0.03, b, equal_var=False, alternative='greater').pvalue)
    assert u.p_high == pytest.approx(stats.ttest_ind(a - 0.03, b, equal_var=False, alternative='less').pvalue)


def test_fewer_than_two_seeds_is_inconclusive():
    v = verdict([0.3], direction='>', paired=True)
    assert v.verdict == INCONCLUSIVE and v.n == 1 and math.isnan(v.p)


@pytest.mark.parametrize('kwargs, message', [
    ({'direction': '>>'}, "direction must be one of '>', '<', '~', '>='"),
    ({'direction': '~'}, 'needs margin > 0'),
    ({'direction': '>', 'effect': -1.0}, '> 0 in the claimed direction'),
    ({'direction': '>', 'margin': 0.1}, "margin is for equality claims"),
    ({'direction': '>', 'alpha': 0.7}, 'alpha must be a one-sided error'),
])
def test_verdict_refuses_a_claim_it_cannot_decide(kwargs, message):
    with pytest.raises(ValueError, match='^[^\n]*$') as e:
        verdict([1.0, 2.0, 3.0], paired=True, **kwargs)
    assert message in str(e.value)


def test_verdict_refuses_samples_of_the_wrong_shape():
    with pytest.raises(ValueError, match='per-seed differences'):
        verdict([[1.0, 2.0], [0.5, 1.0]], direction='>', paired=True)
    with pytest.raises(ValueError, match='two samples'):
        verdict([1.0, 2.0, 3.0], direction='>', paired=False)


# ------------------------------------------------------------------------------------------- Holm
def test_holm_adjusted_pvalues_rejections_and_thresholds():
    # p = 0.01, 0.04, 0.03, 0.005 (m = 4). Sorted: 0.005, 0.01, 0.03, 0.04; times (4, 3, 2, 1): 0.02, 0.03, 0.06,
    # 0.04; running max: 0.02, 0.03, 0.06, 0.06. At alpha 0.05 the step-down passes 0.005 <= 0.05/4 and
    # 0.01 <= 0.05/3, stops at 0.03 > 0.05/2; 0.04 comes after the stop (though 0.04 <= 0.05/1).
    h = holm([0.01, 0.04, 0.03, 0.005], alpha=0.05)
    assert h.adjusted == pytest.approx((0.03, 0.06, 0.06, 0.02))
    assert h.reject == (True, False, False, True)
    assert h.alphas == pytest.approx((0.05 / 3, 0.05 / 2, 0.05 / 2, 0.05 / 4))
    # an untested claim (NaN) is left out of m: 0.01 * 2 = 0.02, then max(0.02, 0.04 * 1) = 0.04
    nan = holm([0.01, math.nan, 0.04], alpha=0.05)
    assert nan.adjusted[0] == pytest.approx(0.02) and math.isnan(nan.adjusted[1])
    assert nan.adjusted[2] == pytest.approx(0.04) and nan.reject == (True, False, True)
    with pytest.raises(ValueError, match='between 0 and 1'):
        holm([0.2, 1.5])


def test_holm_redecides_each_verdict_at_its_threshold():
    # Three '>' claims, differences mean + (-1, 0, 1) sqrt(3) (se 1, df 2): one-sided p = sf2(mean).
    # mean 20: p = 0.00125; mean 6.5: p = 0.01143; mean 5: p = 0.01887. Raw (alpha 0.025) all three hold.
    # Holm at 0.025: 0.00125 <= 0.025/3 = 0.00833, 0.01143 <= 0.025/2 = 0.0125, 0.01887 <= 0.025/1: all rejected.
    # With mean 6.0 instead of 6.5 (p = 0.01334 > 0.0125) the step-down stops there, and the last claim, whose
    # p 0.01887 < 0.025 would pass on its own, no longer holds either.
    for means, expected in [((20, 6.5, 5), (True, True, True)), ((20, 6.0, 5), (True, False, False))]:
        diffs = [three(m, math.sqrt(3)) for m in means]
        raw = [verdict(d, direction='>', paired=True) for d in diffs]
        assert [v.verdict for v in raw] == [HOLDS] * 3
        assert [v.p for v in raw] == pytest.approx([sf2(m) for m in means])
        h = holm([v.p for v in raw])
        assert h.reject == expected
        again = [verdict(d, direction='>', paired=True, alpha=a) for d, a in zip(diffs, h.alphas)]
        assert tuple(v.verdict == HOLDS for v in again) == expected
        assert all(v.half_width >= r.half_width for v, r in zip(again, raw))   # stricter error, wider interval


# ------------------------------------------------------------------------------------------- seeds
def test_seeds_needed_for_the_half_width_and_for_power():
    # sd 1, target 1: half-width t(0.975, n-1)/sqrt(n): n = 6 -> 2.570582/2.449490 = 1.0494; n = 7 ->
    # 2.446912/2.645751 = 0.9248 < 1 -> 7.
    assert seeds_needed(1.0, 1.0) == 7
    assert seeds_needed(1.0, -1.0) == 7
    # power 0.8 at d = 1, two-sided 0.05 (one-sided 0.025): G*Power's one-sample t-test gives n = 10 (power 0.803)
    assert seeds_needed(1.0, 1.0, power=0.8) == 10
    # no spread: two seeds already give a zero-width interval
    assert seeds_needed(0.0, 0.5) == 2
    with pytest.raises(ValueError, match='at least two seeds'):
        seeds_needed(math.nan, 1.0)


def test_an_inconclusive_claim_is_told_how_many_seeds_decide_it():
    # mean 1, sd sqrt(3), paper's effect 4: [-3.30, 5.30] holds 0 and 4. Excluding 4 needs a half-width below
    # 4 - 1 = 3 (excluding 0 would need 1): n = 4 -> t(0.975, 3) sqrt(3)/2 = 3.182446 * 0.866025 = 2.7561 < 3,
    # n = 3 -> 4.3027 > 3.
    v = verdict(three(1.0, math.sqrt(3)), direction='>', effect=4.0, paired=True)
    assert v.verdict == INCONCLUSIVE and v.decisive_halfwidth == pytest.approx(3.0)
    assert seeds_needed(v.sd, v.decisive_halfwidth) == 4
    # and four seeds at the same mean and spread do decide it: (-1.5, -0.5, 0.5, 1.5) has sd sqrt(5/3), so
    # 1 + x sqrt(3) / sqrt(5/3) has mean 1 and sd sqrt(3): [-1.756, 3.756] excludes 4 -> smaller than claimed.
    four = [1 + x * math.sqrt(3) / math.sqrt(5 / 3) for x in (-1.5, -0.5, 0.5, 1.5)]
    w = verdict(four, direction='>', effect=4.0, paired=True)
    assert w.sd == pytest.approx(math.sqrt(3)) and w.verdict == SMALLER


def test_next_seeds_adds_seeds_to_the_undecided_claims_and_stops_at_the_cap():
    # Per-seed differences, revealed one seed at a time. 'flat' alternates +1, -1: its interval always holds 0.
    # 'gain' = 1.0, 0.2, 1.5, 1.0, ...: at 3 seeds mean 0.9, sd 0.6557, half 4.3027 * 0.6557 / sqrt 3 = 1.629
    # (holds 0); at 4 seeds mean 0.925, sd sqrt(0.8675 / 3) = 0.53774, half 3.182446 * 0.53774 / 2 = 0.8557 ->
    # [0.069, 1.781], holds. 'clear' holds from its first 3 seeds and never gets a fourth.
    series = {'flat': [1.0, -1.0] * 5, 'gain': [1.0, 0.2, 1.5, 1.0, 1.1, 0.9, 1.2, 0.8],
              'clear': [1.0, 1.1, 0.9, 1.0, 1.0, 1.0]}
    taken = {name: 2 for name in series}        # one seed short of the minimum: everyone gets a third
    rounds = 0
    while True:
        claims = {name: verdict(series[name][:n], direction='>', paired=True) for name, n in taken.items()}
        more = next_seeds(claims, min_seeds=3, max_seeds=6)
        if rounds == 0:
            assert more == ['flat', 'gain', 'clear']
        if not more:
            break
        for name in more:
            taken[name] += 1
        rounds += 1
    assert taken == {'flat': 6, 'gain': 4, 'clear': 3}
    assert claims['flat'].verdict == INCONCLUSIVE and claims['gain'].verdict == HOLDS
    with pytest.raises(ValueError, match='2 <= min <= max'):
        next_seeds(claims, min_seeds=5, max_seeds=3)


# ------------------------------------------------------------------------------------------- convergence gate
def test_undertrained_gate_on_a_rising_curve_and_a_plateau():
    # accuracy still rising: the last check gained 0.68 - 0.60 = 0.08 > the interval's half-width 0.02
    why = undertrained([0.30, 0.50, 0.60, 0.68], halfwidth=0.02, direction='maximize')
    assert why is not None and 'still improving' in why and '0.08' in why
    # on a plateau: +0.005 <= 0.02
    assert undertrained([0.30, 0.60, 0.700, 0.705], halfwidth=0.02, direction='maximize') is None
    # a loss still falling by 0.3 is undertrained; one that rose at the end (-0.05 gain) is not
    assert 'still improving' in undertrained([2.0, 1.5, 1.2], halfwidth=0.1, direction='minimize')
    assert undertrained([1.0, 0.90, 0.95], halfwidth=0.1, direction='minimize') is None



def test_undertrained_gate_reads_the_trend_not_one_wiggle():
    # fresh seed 100 of ConvBN Tune (benchmarks/paper_blocks.db): a plateau that wiggles -0.0055 then +0.0055
    # at a 0.005 margin; the last gain alone called it undertrained, the slope of the last 3 checks (0) does not
    tune_100 = [0.4178, 0.7967, 0.9025, 0.9359, 0.9304, 0.9749, 0.9582, 0.9749, 0.9694, 0.9749]
    assert undertrained(tune_100, halfwidth=0.005, direction='maximize') is None
    # a steady climb is undertrained on both readings, and the message gives both numbers
    why = undertrained([0.80, 0.82, 0.84, 0.86], halfwidth=0.005, direction='maximize')
    assert why is not None and '0.02' in why and 'last 3 checks' in why
    # a rise of the trend with a flat last check is not (it just flattened), nor a flat trend with a rising check
    assert undertrained([0.80, 0.90, 0.901], halfwidth=0.005, direction='maximize') is None
    assert undertrained([0.90, 0.95, 0.90, 0.96], halfwidth=0.02, direction='maximize') is None

def test_undertrained_gate_on_floors_and_missing_curves():
    # DnCNN on a plateau below the noisy input's 20.17 dB; an accuracy at the copy task's chance level
    why = undertrained([19.90, 20.00, 20.01], halfwidth=0.5, floor=20.17, direction='maximize')
    assert why is not None and 'floor 20.17' in why and 'not above' in why
    assert 'floor' in undertrained([0.050, 0.049], halfwidth=0.05, floor=0.0625, direction='maximize')
    assert 'not below' in undertrained([3.0, 2.9], halfwidth=0.5, floor=2.5, direction='minimize')
    assert 'one validation check' in undertrained([0.9], halfwidth=0.01, direction='maximize')
    assert 'diverged' in undertrained([0.5, math.nan], halfwidth=0.01, direction='maximize')
    with pytest.raises(ValueError, match="'maximize' or 'minimize'"):
        undertrained([0.1, 0.2], halfwidth=0.01, direction='max')
    with pytest.raises(ValueError, match='half-width'):
        undertrained([0.1, 0.2], halfwidth=math.nan, direction='maximize')


# ------------------------------------------------------------------------------------------- bounded intervals
def test_an_interval_of_accuracies_near_one_stays_at_most_one():
    acc = [0.97, 0.99, 1.0]
    # the Student-t interval leaves the range: mean 0.98667, sd 0.015275, half 4.3027 * 0.015275 / sqrt 3 = 0.03795
    mean, half = t_interval(acc)
    assert mean + half == pytest.approx(1.02462, abs=1e-4)
    # arcsine scale: asin(sqrt x) = 1.39671, 1.47063, 1.57080, mean 1.47938, sd 0.08737, half 0.21703 ->
    # [1.26235, 1.69641]; the top is past pi/2, so held at 1.0; sin^2(1.26235) = 0.90783.
    low, high = bounded_interval(acc)
    assert low == pytest.approx(0.90783, abs=1e-4) and high == 1.0
    assert low <= mean <= high
    # the Canon seeds 0.053 / 0.785 / 0.944: the t-interval reaches -0.59, this one stays in [0, 1]
    assert t_interval([0.053, 0.785, 0.944])[0] - t_interval([0.053, 0.785, 0.944])[1] == pytest.approx(-0.5865,
                                                                                                       abs=1e-3)
    assert bounded_interval([0.053, 0.785, 0.944]) == (0.0, 1.0)
    # mIoU in percent: the same interval scaled to [0, 100]
    assert bounded_interval([97, 99, 100], lo=0, hi=100) == pytest.approx((100 * low, 100.0))
    # away from the bounds it is close to the Student-t interval: 0.50, 0.52, 0.54 -> 0.52 +/- 0.0497
    b = bounded_interval([0.50, 0.52, 0.54])
    assert b == pytest.approx((0.52 - 0.0497, 0.52 + 0.0497), abs=2e-3)
    with pytest.raises(ValueError, match="outside the metric's range"):
        bounded_interval([0.5, 1.2])


def test_the_percentile_bootstrap_is_refused_under_five_values():
    with pytest.raises(ValueError, match='at least 5 values, got 3'):
        bootstrap_interval([0.1, 0.2, 0.3, math.nan])
    five = [0.1, 0.2, 0.3, 0.4, 0.5]
    assert bootstrap_interval(five) == bootstrap_ci(five)


def test_normalised_scores_are_relative_to_the_reference_per_dataset():
    # digits: reference mean 0.96 -> resnet 0.95/0.96, 0.97/0.96; meta 0.90/0.96 = 0.9375, 0.92/0.96 = 0.958333.
    # shapes: reference mean 0.55 -> meta 0.55/0.55 = 1.0, 0.66/0.55 = 1.2.
    scores = {'digits': {'resnet': [0.95, 0.97], 'meta': [0.90, 0.92]},
              'shapes': {'resnet': [0.50, 0.60], 'meta': [0.55, 0.66]}}
    out = normalised(scores, 'resnet')
    assert out['digits']['meta'] == pytest.approx([0.9375, 0.958333], abs=1e-6)
    assert out['digits']['resnet'].mean() == pytest.approx(1.0) and out['shapes']['resnet'].mean() == pytest.approx(1)
    assert out['shapes']['meta'] == pytest.approx([1.0, 1.2])
    with pytest.raises(ValueError, match="did you mean 'resnet'") as e:
        normalised(scores, 'resnt')
    assert '\n' not in str(e.value)
