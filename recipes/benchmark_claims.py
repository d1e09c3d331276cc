"""The claims of a benchmark decided from its database (issue 43): what the runner adds seeds by and what the
report prints. The statistics are ``zoo.eval.results.decide``'s; this module only fetches the numbers.

For each claim of each group: the two entries' finished runs by seed (``by_seed``), their difference (paired by
seed when the claim says ``paired: true``, else Welch), the raw verdict against the paper's effect or margin, the
convergence gate on every seed's validation curve of both entries (``decide.undertrained``: the last check's gain
against the claim interval's half-width, or the margin of a '~' / '>=' claim when that is larger, and the group's
floor), Holm's adjustment across every decided-able
claim of the page, and, for a claim still inconclusive, the seeds it would need at the observed spread.

The gate reads the claim's metric at each validation check (``zoo_metrics`` rows that are not ``final``). A claim
on a measurement of the trained network rather than of its training (bytes saved for backward, a step-time
ratio: logged once) has no curve and is not gated: more steps would not change it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .benchmark_spec import Benchmark, Claim, Group

UNDERTRAINED, NOT_TESTED, NOT_RUN = 'undertrained', 'not tested on a CPU', 'not run yet'


@dataclass
class ClaimResult:
    group: Group
    claim: Claim
    n_a: int = 0
    n_b: int = 0
    mean_a: float = math.nan
    mean_b: float = math.nan
    raw: object = None                 # decide.Verdict
    adjusted: object = None            # the same claim re-decided at its Holm threshold
    gate: str | None = None            # why an entry is undertrained, or None
    needed: int | None = None          # seeds the observed spread needs (inconclusive claims)

    @property
    def status(self) -> str:
        if self.claim.not_tested:
            return NOT_TESTED
        if self.gate:
            return UNDERTRAINED
        if not (self.n_a and self.n_b):
            return NOT_RUN
        return self.raw.verdict

    @property
    def testable(self) -> bool:
        """A verdict that counts on the page: tested, past the gate, with an interval (Holm's m)."""
        return not self.claim.not_tested and not self.gate and self.raw is not None and self.raw.n >= 2


def current(bench: Benchmark, df, store):
    """The rows of ``df`` (``results.data()``) that are jobs of the file as it stands: a run of an earlier budget
    (another recipe, overrides or seed set: another job key) is not this benchmark's result any more."""
    keys = {j.key for j in bench.possible_jobs()}
    runs = store.runs(columns=['id', 'hparams'])
    ok = {int(i) for i, hp in zip(runs.id, runs.hparams) if isinstance(hp, dict)
          and isinstance(hp.get('benchmark'), dict) and hp['benchmark'].get('name') == bench.name
          and hp['benchmark'].get('key') in keys}
    return df[(df.benchmark == bench.name) & df.run_id.isin(ok)] if 'benchmark' in df.columns else df.iloc[:0]


def by_seed(df, group: str, entry: str, metric: str) -> dict[int, float]:
    """``{seed: value}`` of an entry's finished runs (``results.data()`` rows of the benchmark)."""
    rows = df[(df.group == group) & (df.entry == entry) & (df.status == 'finished')]
    if metric not in rows.columns:
        return {}
    out = {}
    for seed, v in zip(rows.seed, rows[metric]):
        if v is not None and v == v:
            out[int(seed)] = float(v)
    return out


def run_ids(df, group: str, entry: str) -> list[int]:
    rows = df[(df.group == group) & (df.entry == entry) & (df.status == 'finished')]
    return [int(i) for i in rows.run_id]


def curve(store, run_id: int, metric: str) -> list[float]:
    """The metric at each validation check of one run, in order (its per-check rows, not the final copy)."""
    m = store.metrics(run_id, name=metric, final=False)
    if m.empty:
        return []
    m = m.sort_values(['step', 'id'], na_position='first')
    return [float(v) for v in m.value]


def metric_direction(metric: str, compare: str = '>') -> str:
    """'maximize' or 'minimize' for the gate: the metric's own direction, else the claim's."""
    from zoo.eval.results import ResultsDBError, is_higher_better
    try:
        return 'maximize' if is_higher_better(metric) else 'minimize'
    except ResultsDBError:
        return 'minimize' if compare == '<' else 'maximize'


def _gate(store, df, g: Group, c: Claim, halfwidth: float) -> str | None:
    """Why one of the claim's runs is undertrained (``decide.undertrained`` on every seed of both entries), or None.
    A claim on a measurement of the trained network (a metric without a curve of two checks or more: bytes saved
    for backward, a step-time ratio) is not gated: more training would not change it."""
    from zoo.eval.results import decide

    runs = [(e, int(seed), rid) for e in c.entries
            for seed, rid in sorted(zip(df[(df.group == g.name) & (df.entry == e) & (df.status == 'finished')].seed,
                                        run_ids(df, g.name, e)))]
    curves = {rid: curve(store, rid, c.metric) for _, _, rid in runs}
    if not any(len(v) >= 2 for v in curves.values()):
        return None
    floor = g.floor if c.metric == g.metric else None
    direction = metric_direction(c.metric, c.compare)
    for e, seed, rid in runs:
        why = decide.undertrained(curves[rid], halfwidth=halfwidth, floor=floor, direction=direction)
        if why:
            return f'{e} seed {seed}: {why}'
    return None


def decide_claims(bench: Benchmark, df, store) -> list[ClaimResult]:
    """Every claim of ``bench`` decided on ``df`` (``results.data(status=None)`` rows of this benchmark), in the
    file's order, with Holm's adjustment over the claims that pass the gate."""
    from zoo.eval.results import decide

    out = []
    for g in bench.groups.values():
        for c in g.claims:
            r = ClaimResult(g, c)
            out.append(r)
            if c.not_tested:
                continue
            a, b = (by_seed(df, g.name, e, c.metric) for e in c.entries)
            r.n_a, r.n_b = len(a), len(b)
            r.mean_a = sum(a.values()) / len(a) if a else math.nan
            r.mean_b = sum(b.values()) / len(b) if b else math.nan
            if c.paired:
                d = decide.paired_difference(a, b)
                r.raw = decide.verdict(d, direction=c.compare, effect=c.effect, margin=c.margin, paired=True)
            else:
                r.raw = decide.verdict((list(a.values()), list(b.values())), direction=c.compare, effect=c.effect,
                                       margin=c.margin, paired=False)
            # the resolution of the decision: the interval's half-width, and for '~' / '>=' at least the margin
            # (two entries identical seed for seed have a zero-width interval, which no curve could stay under)
            half = max(r.raw.half_width, c.margin or 0.0) if r.raw.n >= 2 else math.inf
            r.gate = _gate(store, df, g, c, half)
    tested = [r for r in out if r.testable]
    h = decide.holm([r.raw.p for r in tested])
    for r, alpha in zip(tested, h.alphas):
        r.adjusted = _redecide(r, alpha, df)
        if not r.raw.decided and r.raw.decisive_halfwidth > 0 and math.isfinite(r.raw.sd):
            r.needed = decide.seeds_needed(r.raw.sd, r.raw.decisive_halfwidth)
    return out


def _redecide(r: ClaimResult, alpha: float, df):
    from zoo.eval.results import decide

    c, g = r.claim, r.group
    a, b = (by_seed(df, g.name, e, c.metric) for e in c.entries)
    x = decide.paired_difference(a, b) if c.paired else (list(a.values()), list(b.values()))
    return decide.verdict(x, direction=c.compare, effect=c.effect, margin=c.margin, paired=c.paired, alpha=alpha)


def seeds_to_add(bench: Benchmark, results: list[ClaimResult], attempted: dict) -> list[tuple[str, str, int]]:
    """(group, entry, seed) to train next by the sequential rule (``decide.next_seeds``): for each claim still
    inconclusive past the gate (an undertrained claim needs steps, not seeds), one more seed for both entries,
    the same seed on both (so the pair stays paired), below the group's cap. ``attempted``: (group, entry) ->
    the seeds that have a row of any status (a failed seed counts against the cap: the rule does not loop)."""
    from zoo.eval.results import decide

    add: dict[tuple[str, str, int], None] = {}
    for r in results:
        g = r.group
        if r.claim.not_tested or r.gate or not g.max_seeds or r.raw is None:
            continue
        if not decide.next_seeds({'c': r.raw}, g.min_seeds, g.max_seeds):
            continue
        tried = [set(attempted.get((g.name, e), ())) for e in r.claim.entries]
        if max(len(t) for t in tried) >= g.max_seeds:
            continue
        seed = max(max(t) if t else -1 for t in tried) + 1
        for e in r.claim.entries:
            add[(g.name, e, seed)] = None
    return list(add)
