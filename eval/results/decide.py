"""Deciding a paper's claim from seeds (issue 43): paired differences, the four verdicts against the paper's
effect, equivalence by TOST, Holm's correction across a page, the seeds a claim still needs, the gate that keeps
an undertrained entry from getting a verdict, and intervals that stay inside a metric's range.

Conventions. A claim compares entry ``a`` with entry ``b`` on one metric: ``direction`` '>' (a higher than b),
'<' (a lower than b) or '~' (equal within ``margin``). Every decision is made on the two-sided interval of
``a - b`` at ``level`` = 1 - 2 alpha, so each of its ends is a one-sided test at ``alpha`` (0.025 for the usual
95 % interval) and the interval and the reported p-values always agree.

Sources: Student (1908) and Welch (1947) for the paired and unequal-variance t statistics; Schuirmann (1987)
and Lakens (2017, "Equivalence tests", Soc. Psychol. Personal. Sci. 8:355) for TOST; Holm (1979, "A simple
sequentially rejective multiple test procedure", Scand. J. Statist. 6:65); Bartlett (1936) and Anscombe (1948)
for the arcsine square-root scale of proportions.

How the runner and the report use it: per claim ``d = paired_difference(a_by_seed, b_by_seed)``, ``v = verdict(d,
direction=claim.compare, effect=..., margin=..., paired=claim.paired)``; the runner gates every seed's curve of
both entries with ``undertrained(curve, halfwidth=v.half_width, ...)`` and trains one more seed for the claims
``next_seeds`` names. The report prints "undertrained" where the gate gives a reason, else ``v.verdict`` beside
``verdict(d, ..., alpha=holm(ps).alphas[i])``, ``v.n`` and ``seeds_needed(v.sd, v.decisive_halfwidth)``;
entries get ``bounded_interval``, "across" tables ``normalised`` scores (a bootstrap only via ``bootstrap_interval``).
"""
from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from .stats import bootstrap_ci, t_interval

HOLDS, SMALLER, FAILS, INCONCLUSIVE = 'holds', 'smaller than claimed', 'does not hold', 'inconclusive'
VERDICTS = (HOLDS, SMALLER, FAILS, INCONCLUSIVE)
DIRECTIONS = ('>', '<', '~', '>=')
METRIC_DIRECTIONS = ('maximize', 'minimize')
LEVEL = 0.95
ALPHA = (1 - LEVEL) / 2      # the one-sided error of each end of a 95 % interval
MIN_BOOTSTRAP = 5            # below this a percentile bootstrap of the mean is about the values' min-max


# ------------------------------------------------------------------------------------------- paired seeds
@dataclass(frozen=True)
class Difference:
    """``a - b`` on the seeds both sides have: the matched values, the paired Student-t interval of the mean
    difference (``low``, ``high``) and, on the same numbers, the unpaired Welch interval (``welch_low``,
    ``welch_high``), so a report can show what pairing buys."""
    seeds: tuple
    a: tuple[float, ...]
    b: tuple[float, ...]
    level: float
    mean: float
    sd: float
    low: float
    high: float
    welch_low: float
    welch_high: float

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def diffs(self) -> tuple[float, ...]:
        return tuple(x - y for x, y in zip(self.a, self.b))


def _by_seed(values, seeds, name: str) -> dict:
    """``{seed: value}`` from a dict, or from a sequence and its seed list."""
    if isinstance(values, Mapping):
        if seeds is not None:
            raise ValueError(f'{name}: pass either a {{seed: value}} dict or values with seeds_{name}, not both')
        return {s: float(v) for s, v in values.items()}
    if seeds is None:
        raise ValueError(f'{name}: values are paired by seed: pass a {{seed: value}} dict or seeds_{name}=[...] '
                         f'aligned with the values')
    values, seeds = list(values), list(seeds)
    if len(values) != len(seeds):
        raise ValueError(f'{name}: {len(values)} values but {len(seeds)} seeds; expected one seed per value')
    if len(set(seeds)) != len(seeds):
        dup = sorted({s for s in seeds if seeds.count(s) > 1}, key=str)
        raise ValueError(f'{name}: seed(s) {", ".join(map(str, dup))} given twice; expected one value per seed')
    return {s: float(v) for s, v in zip(seeds, values)}


def paired_difference(a, b, level: float = LEVEL, *, seeds_a=None, seeds_b=None) -> Difference:
    """Per-seed differences ``a_i - b_i`` over the seeds both sides have (in ``a``'s order), a seed dropped when
    either value is NaN. ``a``/``b``: ``{seed: value}`` dicts, or sequences with ``seeds_a``/``seeds_b``.

    Paired interval: mean(d) +/- t(0.5 + level/2, n-1) sd(d)/sqrt(n) (``stats.t_interval``; Student 1908).
    Welch interval of the same values unpaired (Welch 1947; see ``_welch``). NaN below two pairs."""
    _check_level(level)
    a, b = _by_seed(a, seeds_a, 'a'), _by_seed(b, seeds_b, 'b')
    seeds = tuple(s for s in a if s in b and not (math.isnan(a[s]) or math.isnan(b[s])))
    xa, xb = np.array([a[s] for s in seeds]), np.array([b[s] for s in seeds])
    d = xa - xb
    mean, half = t_interval(d, level)
    welch = _welch(xa, xb, (1 - level) / 2)
    return Difference(seeds, tuple(xa.tolist()), tuple(xb.tolist()), level, mean,
                      float(d.std(ddof=1)) if len(d) > 1 else math.nan, mean - half, mean + half,
                      welch.low, welch.high)


# ------------------------------------------------------------------------------------------- the estimate
@dataclass(frozen=True)
class _Estimate:
    """The mean of ``a - b`` with its standard error, degrees of freedom and (1 - 2 alpha) interval."""
    estimate: float
    se: float
    df: float
    low: float
    high: float
    n: int
    sd: float      # per-seed spread, se = sd / sqrt(n)


_NONE = _Estimate(math.nan, math.nan, math.nan, math.nan, math.nan, 0, math.nan)


def _paired(d, alpha: float) -> _Estimate:
    """Student's one-sample t on the per-seed differences: se = sd/sqrt(n), df = n - 1."""
    d = d[~np.isnan(d)]
    if len(d) < 2:
        return replace(_NONE, n=len(d))
    mean, half = t_interval(d, 1 - 2 * alpha)
    sd = float(d.std(ddof=1))
    return _Estimate(mean, sd / math.sqrt(len(d)), len(d) - 1, mean - half, mean + half, len(d), sd)


def _welch(a, b, alpha: float) -> _Estimate:
    """Welch's unequal-variance t: se = sqrt(va/na + vb/nb), df = se^4 / ((va/na)^2/(na-1) + (vb/nb)^2/(nb-1))
    (Welch-Satterthwaite). ``n`` is the smaller side and ``sd`` = se sqrt(n), so ``seeds_needed`` reads it as
    the spread per seed of a balanced design."""
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    n = min(len(a), len(b))
    if n < 2:
        return replace(_NONE, n=n)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    est, se = float(a.mean() - b.mean()), math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if se > 0 else math.inf
    half = float(stats.t.ppf(1 - alpha, df)) * se
    return _Estimate(est, se, df, est - half, est + half, n, se * math.sqrt(n))


def _p_above(estimate: float, se: float, df: float, null: float) -> float:
    """One-sided p of H0 "true difference <= null": P(T_df >= (estimate - null)/se). Without spread (se = 0)
    the limit: 0 above the null, 1 below, 0.5 on it."""
    if se == 0:
        return 0.0 if estimate > null else 1.0 if estimate < null else 0.5
    return float(stats.t.sf((estimate - null) / se, df))


def _estimate(x, paired: bool, alpha: float) -> _Estimate:
    if isinstance(x, Difference):
        a, b = np.asarray(x.a, float), np.asarray(x.b, float)
        return _paired(a - b, alpha) if paired else _welch(a, b, alpha)
    if paired:
        d = np.asarray(x, dtype=float)
        if d.ndim != 1:
            raise ValueError('paired=True takes the per-seed differences a_i - b_i (one number per seed) or a '
                             'Difference from paired_difference')
        return _paired(d, alpha)
    try:
        a, b = (np.asarray(s, dtype=float) for s in x)
    except (TypeError, ValueError):
        a = b = None
    if a is None or a.ndim != 1 or b.ndim != 1:
        raise ValueError('paired=False takes the two samples (a_values, b_values) or a Difference from '
                         'paired_difference')
    return _welch(a, b, alpha)


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f'level must be a confidence level between 0 and 1 (e.g. 0.95); got {level!r}')


# ------------------------------------------------------------------------------------------- verdicts
@dataclass(frozen=True)
class Verdict:
    """One claim decided. ``low``/``high``: the interval of a - b at ``level`` = 1 - 2 ``alpha``. ``p``: what
    Holm adjusts, the one-sided p of the claimed direction ('>', '<': H0 "a is not better"), or for '~' the
    larger of TOST's two one-sided p's (``p_low``: H0 d <= -margin, ``p_high``: H0 d >= +margin). ``n``: the
    seeds it took (pairs; unpaired, the smaller side). ``sd``: the spread per seed (se = sd / sqrt(n))."""
    verdict: str
    why: str
    direction: str
    paired: bool
    n: int
    estimate: float
    low: float
    high: float
    level: float
    alpha: float
    p: float
    sd: float
    effect: float | None = None
    margin: float | None = None
    p_low: float = math.nan
    p_high: float = math.nan

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def decided(self) -> bool:
        return self.verdict != INCONCLUSIVE

    @property
    def decisive_halfwidth(self) -> float:
        """The half-width below which the interval, at today's mean, would reach a verdict (for
        ``seeds_needed``). '>'/'<' with m the mean in the claimed direction: |m| to exclude 0; with the paper's
        effect E, max(m, E - m) (excluding 0 or E both decide). '~': |margin - |m|| (inside or outside)."""
        if self.direction == '~':
            return abs(self.margin - abs(self.estimate))
        if self.direction == '>=':
            return abs(self.estimate + self.margin)
        m = self.estimate if self.direction == '>' else -self.estimate
        return abs(m) if self.effect is None else max(m, self.effect - m)


def verdict(diffs_or_samples, *, direction: str, effect: float | None = None, margin: float | None = None,
            level: float = LEVEL, alpha: float | None = None, paired: bool) -> Verdict:
    """Decide one claim. ``diffs_or_samples``: a ``Difference`` (``paired`` picks the paired or the Welch
    interval), per-seed differences (paired) or the pair of samples ``(a, b)`` (unpaired). ``alpha`` (e.g.
    ``holm(...).alphas[i]``), when given, replaces ``level`` by 1 - 2 alpha: the claim re-decided at that error.

    '>' and '<', with [L, H] the interval turned so that the claimed direction is positive and E > 0 the
    paper's effect in the metric's units (optional):
    - does not hold: H < 0, the interval lies wholly against the claim;
    - smaller than claimed: 0 <= H < E, the interval excludes the paper's effect from below. This includes
      L > 0 (a real gain, but smaller than the paper's): the paper's number is what is tested, so a gain
      shown to fall short of it is not "holds"; ``why`` says which of the two it is;
    - holds: L > 0 and H >= E (or L > 0 without E); the interval excludes 0 and not the paper's effect
      (an interval wholly above E is a larger gain than the paper's, still "holds");
    - inconclusive: otherwise (the interval holds 0, and E too when given), or fewer than two seeds.
    '~' (TOST at ``margin``, Schuirmann 1987, Lakens 2017): holds when both one-sided tests reject, i.e. the
    interval lies inside (-margin, +margin); does not hold when the interval lies wholly outside it (the
    difference is shown to exceed the margin: L > margin or H < -margin); else inconclusive."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of '>', '<', '~', '>=' (a higher than, lower than, equal to, not "
                         f'worse than b); got {direction!r}')
    if direction in ('~', '>='):
        if effect is not None:
            raise ValueError("effect is the paper's gain for '>' and '<' claims; an equality claim ('~') takes "
                             'margin')
        if margin is None or not margin > 0:
            raise ValueError("an equality claim ('~') needs margin > 0, the largest difference that still counts "
                             f"as equal, in the metric's units; got {margin!r}")
    else:
        if margin is not None:
            raise ValueError(f"margin is for equality claims ('~'); a {direction!r} claim takes effect")
        if effect is not None and not effect > 0:
            raise ValueError("effect is the size of the paper's gain in the metric's units, > 0 in the claimed "
                             f'direction; got {effect!r}')
    if alpha is None:
        _check_level(level)
        alpha = (1 - level) / 2
    elif 0 < alpha < 0.5:
        level = 1 - 2 * alpha
    else:
        raise ValueError(f'alpha must be a one-sided error between 0 and 0.5 (e.g. 0.025); got {alpha!r}')
    e = _estimate(diffs_or_samples, paired, alpha)
    common = dict(direction=direction, paired=paired, n=e.n, estimate=e.estimate, low=e.low, high=e.high,
                  level=level, alpha=alpha, sd=e.sd, effect=effect, margin=margin)
    if e.n < 2:
        return Verdict(INCONCLUSIVE, f'{e.n} seed(s): an interval needs two', p=math.nan, **common)
    if direction == '~':
        return _equivalence(e, margin, common)
    if direction == '>=':
        return _non_inferiority(e, margin, common)
    sign = 1 if direction == '>' else -1
    lo, hi = sorted((sign * e.low, sign * e.high))
    p = _p_above(sign * e.estimate, e.se, e.df, 0.0)
    word = 'higher' if direction == '>' else 'lower'
    if hi < 0:
        v, why = FAILS, f'the interval lies wholly against the claim: a is not {word}'
    elif effect is not None and hi < effect:
        v, why = SMALLER, (f"a real gain, smaller than the paper's {effect:g}" if lo > 0 else
                           f"no gain shown, and the interval excludes the paper's {effect:g}")
    elif lo > 0:
        v = HOLDS
        why = 'the interval excludes 0' + ('' if effect is None else f" and lies above the paper's {effect:g}"
                                            if lo > effect else f" and holds the paper's {effect:g}")
    else:
        v, why = INCONCLUSIVE, 'the interval holds 0' + ('' if effect is None else f" and the paper's {effect:g}")
    return Verdict(v, why, p=p, **common)


def _equivalence(e: _Estimate, margin: float, common: dict) -> Verdict:
    """TOST: p_low of H0 d <= -margin, p_high of H0 d >= +margin; equivalence when both are below alpha, which is
    the (1 - 2 alpha) interval lying inside (-margin, +margin)."""
    p_low = _p_above(e.estimate, e.se, e.df, -margin)
    p_high = _p_above(-e.estimate, e.se, e.df, -margin)
    ps = f'TOST p = {p_low:.3g}, {p_high:.3g}'
    if -margin < e.low and e.high < margin:
        v, why = HOLDS, f'the interval lies inside ±{margin:g} ({ps})'
    elif e.low > margin or e.high < -margin:
        v, why = FAILS, f'the interval lies wholly outside ±{margin:g}: the difference exceeds the margin'
    else:
        v, why = INCONCLUSIVE, f'the interval crosses ±{margin:g} ({ps})'
    return Verdict(v, why, p=max(p_low, p_high), p_low=p_low, p_high=p_high, **common)


def _non_inferiority(e: _Estimate, margin: float, common: dict) -> Verdict:
    """'>=' ("a matches or beats b"): the one-sided test of H0 d <= -margin (Lakens 2017, the lower half of
    TOST). Holds when the interval's lower end lies above -margin; does not hold when its upper end lies below
    -margin (a is shown worse by more than the margin); else inconclusive."""
    p = _p_above(e.estimate, e.se, e.df, -margin)
    if e.low > -margin:
        v, why = HOLDS, f'the interval lies above -{margin:g}: a is not worse by the margin (p = {p:.3g})'
    elif e.high < -margin:
        v, why = FAILS, f'the interval lies below -{margin:g}: a is worse than b by more than the margin'
    else:
        v, why = INCONCLUSIVE, f'the interval crosses -{margin:g} (p = {p:.3g})'
    return Verdict(v, why, p=p, p_low=p, **common)


# ------------------------------------------------------------------------------------------- Holm
@dataclass(frozen=True)
class Holm:
    """Holm's step-down over a page of claims, in the order given. ``adjusted``: the adjusted p-values;
    ``reject``: adjusted <= alpha; ``alphas``: the error at which each claim's own test is re-decided
    (``verdict(..., alpha=alphas[i])``) so that it agrees with ``reject``."""
    adjusted: tuple[float, ...]
    reject: tuple[bool, ...]
    alphas: tuple[float, ...]
    alpha: float


def holm(pvalues, alpha: float = ALPHA) -> Holm:
    """Holm-Bonferroni (Holm 1979) on m p-values sorted p_(1) <= ... <= p_(m): adjusted
    p~_(k) = min(1, max_{j<=k} (m - j + 1) p_(j)); reject when p~ <= alpha. The step-down tests p_(k) against
    alpha / (m - k + 1) and stops at the first that fails; ``alphas`` is that threshold at a claim's rank, or the
    threshold where the step-down stopped when that came first, so a claim past the stop is not rejected. Re-deciding
    widens the whole interval, so 'smaller than claimed' and 'does not hold' are re-decided at that error too.
    ``alpha`` defaults to 0.025, the one-sided error of the 95 % intervals of the raw verdicts. A NaN p-value
    (a claim with fewer than two seeds) is no test: it is left out of m, adjusted NaN, not rejected, and
    re-decided at the strictest threshold alpha / m."""
    p = np.asarray(pvalues, dtype=float)
    if p.ndim != 1 or np.any((p < 0) | (p > 1)):
        raise ValueError('holm takes one p-value per claim, each between 0 and 1 (NaN for an untested claim)')
    if not 0 < alpha < 1:
        raise ValueError(f'alpha must be between 0 and 1 (e.g. 0.025); got {alpha!r}')
    tested = np.flatnonzero(~np.isnan(p))
    m = len(tested)
    adjusted, alphas = np.full(len(p), math.nan), np.full(len(p), alpha / max(m, 1))
    reject = np.zeros(len(p), dtype=bool)
    running, stop = 0.0, None
    for k, i in enumerate(tested[np.argsort(p[tested], kind='stable')]):
        threshold = alpha / (m - k)                      # rank k + 1 of m
        if stop is None and p[i] > threshold:
            stop = threshold
        running = max(running, min(1.0, (m - k) * p[i]))
        adjusted[i], alphas[i], reject[i] = running, threshold if stop is None else stop, running <= alpha
    return Holm(tuple(adjusted.tolist()), tuple(reject.tolist()), tuple(alphas.tolist()), alpha)


# ------------------------------------------------------------------------------------------- seeds
def seeds_needed(sd: float, effect: float, level: float = LEVEL, power: float | None = None) -> int:
    """Seeds (pairs) the observed spread ``sd`` needs for the interval's half-width t(0.5 + level/2, n-1)
    sd/sqrt(n) to fall below |effect| (pass ``Verdict.decisive_halfwidth``, or a margin). With ``power``
    (0.5 <= power < 1): the seeds at which the one-sided t-test at (1 - level)/2 detects a true difference of
    |effect| with that probability, from the noncentral t (power = P(T'(n-1, |effect| sqrt(n)/sd) >
    t(1 - alpha, n-1)), as G*Power computes it). The smallest such n >= 2, found by doubling then bisection
    (both criteria are monotone in n)."""
    _check_level(level)
    if not (math.isfinite(sd) and sd >= 0):
        raise ValueError(f'seeds_needed takes the observed spread (sd >= 0) of at least two seeds; got {sd!r}')
    target = abs(effect)
    if not (math.isfinite(target) and target > 0):
        raise ValueError(f'effect must be a non-zero number (the half-width to reach); got {effect!r}')
    if power is not None and not 0.5 <= power < 1:
        raise ValueError(f'power must be between 0.5 and 1 (e.g. 0.8); got {power!r}')
    alpha = (1 - level) / 2

    def enough(n: int) -> bool:
        crit = stats.t.ppf(1 - alpha, n - 1)
        if power is None:
            return crit * sd / math.sqrt(n) < target
        return sd == 0 or stats.nct.sf(crit, n - 1, target * math.sqrt(n) / sd) >= power

    fail, ok = 1, 2                  # n = 1 has no interval: the bisection's lower end
    while not enough(ok):
        fail, ok = ok, ok * 2
    while ok - fail > 1:
        mid = (fail + ok) // 2
        fail, ok = (fail, mid) if enough(mid) else (mid, ok)
    return ok


def next_seeds(claims: Mapping[str, Verdict], min_seeds: int, max_seeds: int) -> list[str]:
    """The claims whose entries get another seed: those below ``min_seeds``, and the inconclusive ones below
    ``max_seeds``; a decided claim or one at the cap gets none (the report then says how many it would need).
    Pass only claims whose entries passed ``undertrained``: those need more steps, not more seeds. Adding seeds
    until a verdict is optional stopping, which the raw interval does not account for; the cap bounds it and
    the issue's re-run on fresh seeds checks it."""
    if not 2 <= min_seeds <= max_seeds:
        raise ValueError(f'seeds need 2 <= min <= max; got min {min_seeds!r}, max {max_seeds!r}')
    return [name for name, v in claims.items() if v.n < min_seeds or (not v.decided and v.n < max_seeds)]


# ------------------------------------------------------------------------------------------- convergence gate
TREND_CHECKS = 3  # the checks whose least-squares slope is the curve's trend (``undertrained``)


def undertrained(curve, *, halfwidth: float, floor: float | None = None, direction: str) -> str | None:
    """Why an entry's run is undertrained, or None when it has converged (issue 43 item 1). ``curve``: the
    metric at each validation check, in order, of one seed (call it per seed: one seed still rising is enough);
    ``direction``: the metric's, 'maximize' or 'minimize'. Undertrained when the final value is not better than
    ``floor`` (the noisy input's PSNR, the task's chance level), when there is no curve to judge, or when the
    curve still rises by more than ``halfwidth`` (the claim interval's: more training would move the entry by
    more than the comparison can resolve) both at its last check and on the trend of its last
    :data:`TREND_CHECKS` checks (the least-squares slope per check). A single check is noise as much as trend: a
    plateau that wiggles (-0.0055 then +0.0055 at a 0.005 margin) is not rising, and a curve that just flattened
    (+0.10 then +0.005) is not either. Until 2026-12-06 the rule read the last check's gain alone; the trend was
    added after a fresh seed's wiggling plateau was called undertrained (a rule changed after seeing data, and
    more lenient: every curve the old rule passed, this one passes)."""
    if direction not in METRIC_DIRECTIONS:
        raise ValueError(f"direction is the metric's, 'maximize' or 'minimize'; got {direction!r}")
    if not (isinstance(halfwidth, numbers.Real) and halfwidth >= 0):
        raise ValueError("halfwidth must be the claim interval's half-width, a number >= 0 (a claim with fewer "
                         f'than two seeds has none); got {halfwidth!r}')
    x = np.asarray(curve, dtype=float)
    if x.ndim != 1:
        raise ValueError('curve is one seed\'s metric at each validation check (one number per check)')
    if len(x) == 0:
        return 'no validation check recorded'
    if not math.isfinite(x[-1]):
        return f'the last validation check is {x[-1]} (diverged or not logged)'
    sign = 1 if direction == 'maximize' else -1
    if floor is not None and sign * x[-1] <= sign * floor:
        return f"the final value {x[-1]:.4g} is not {'above' if sign > 0 else 'below'} the floor {floor:.4g}"
    if len(x) < 2 or not math.isfinite(x[-2]):
        return 'one validation check: no curve to show a plateau'
    gain = sign * (x[-1] - x[-2])
    tail = x[-TREND_CHECKS:]
    tail = tail[np.isfinite(tail)]
    trend = sign * float(np.polyfit(np.arange(len(tail)), tail, 1)[0]) if len(tail) >= 2 else gain
    if min(gain, trend) > halfwidth:
        return (f'still improving: the last validation check gained {gain:.4g} and the last {len(tail)} checks '
                f"{trend:.4g} a check, more than the claim interval's half-width {halfwidth:.4g}")
    return None


# ------------------------------------------------------------------------------------------- bounded intervals
def bounded_interval(values, lo: float = 0.0, hi: float = 1.0, level: float = LEVEL) -> tuple[float, float]:
    """An interval over seeds that never leaves the metric's range [lo, hi] (accuracy, mIoU, mAP): the
    Student-t interval of the mean of asin(sqrt(u)), u = (x - lo)/(hi - lo), ends held to [0, pi/2] and mapped
    back by lo + (hi - lo) sin^2. The arcsine square root is the variance-stabilising scale of a proportion
    (Bartlett 1936, Anscombe 1948) and, unlike the logit, finite at 0 and 1, so a perfect score needs no
    arbitrary epsilon (which on the logit scale sets the width at will). It is an interval of the mean on that
    scale, close to the mean of the values away from the bounds. NaN below two values; a value outside
    [lo, hi] is an error."""
    _check_level(level)
    if not hi > lo:
        raise ValueError(f'the range needs lo < hi; got lo {lo!r}, hi {hi!r}')
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if np.any((x < lo) | (x > hi)):
        raise ValueError(f'values {sorted(x[(x < lo) | (x > hi)].tolist())} lie outside the metric\'s range '
                         f'[{lo:g}, {hi:g}]')
    if len(x) < 2:
        return math.nan, math.nan
    mean, half = t_interval(np.arcsin(np.sqrt((x - lo) / (hi - lo))), level)
    ends = np.sin(np.clip([mean - half, mean + half], 0, math.pi / 2)) ** 2
    return float(lo + (hi - lo) * ends[0]), float(lo + (hi - lo) * ends[1])


def bootstrap_interval(values, level: float = LEVEL, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """``stats.bootstrap_ci`` from at least five values (NaN dropped); fewer is a ValueError: resampling three
    seeds returns about their min and max, which is no 95 % interval."""
    x = np.asarray(values, dtype=float)
    n = int((~np.isnan(x)).sum())
    if n < MIN_BOOTSTRAP:
        raise ValueError(f'a percentile bootstrap needs at least {MIN_BOOTSTRAP} values, got {n}: use '
                         'bounded_interval or stats.t_interval')
    return bootstrap_ci(x, n_boot=n_boot, level=level, seed=seed)


def normalised(scores: Mapping[str, Mapping[str, object]], reference: str) -> dict[str, dict[str, np.ndarray]]:
    """Scores relative to a reference entry per dataset, for "across" tables: ``{dataset: {entry: values}}`` ->
    the same with every value divided by the reference entry's mean on that dataset (1.0 = the reference;
    for a lower-is-better metric below 1 is better). A dataset at 0.95 and one at 0.56 then weigh alike. This
    is the ``normalize={dataset: (0, reference mean)}`` mapping of ``results.aggregate``."""
    out = {}
    for dataset, entries in scores.items():
        if reference not in entries:
            close = difflib.get_close_matches(reference, list(entries), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else f"; it has {', '.join(entries)}"
            raise ValueError(f'reference entry {reference!r} is not in dataset {dataset!r}{hint}')
        ref = np.asarray(entries[reference], dtype=float)
        base = float(np.nanmean(ref)) if (~np.isnan(ref)).any() else math.nan
        if not (math.isfinite(base) and base != 0):
            raise ValueError(f'reference entry {reference!r} has no non-zero mean on dataset {dataset!r} '
                             f'(got {base}); pick a reference with a score there')
        out[dataset] = {e: np.asarray(v, dtype=float) / base for e, v in entries.items()}
    return out
