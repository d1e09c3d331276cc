"""Statistics over seeds and tasks: one percentile bootstrap (stratified; one stratum for a plain interval)
and the interquartile mean (Agarwal et al. 2021)."""
from __future__ import annotations

# ------------------------------------------------------------------------------------------------- statistics
def bootstrap_ci(values, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (NaN for fewer than two values): ``stratified_bootstrap``
    with one stratum."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    return stratified_bootstrap([x[~np.isnan(x)]], _mean_rows, n_boot=n_boot, level=level, seed=seed)


def iqm(values) -> float:
    """Interquartile mean (Agarwal et al., "Deep RL at the Edge of the Statistical Precipice", 2021):
    the mean of the middle 50 %, robust to one outlying seed."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    return float(_iqm_rows(x)) if len(x) else float('nan')


def _iqm_rows(x):
    """IQM along the last axis: the mean of the middle 50 % of the scores (25 % trimmed each side)."""
    from scipy.stats import trim_mean
    return trim_mean(x, 0.25, axis=-1)


def _mean_rows(x):
    return x.mean(axis=-1)


AGGREGATE_STATISTICS = {'iqm': _iqm_rows, 'mean': _mean_rows}


def stratified_bootstrap(strata, statistic, n_boot: int = 2000, level: float = 0.95, seed: int = 0):
    """Percentile interval of ``statistic`` over the pooled scores of several strata (tasks), resampling
    the runs of each stratum independently, so every replicate keeps each task's number of runs
    (Agarwal et al. 2021, "Deep Reinforcement Learning at the Edge of the Statistical Precipice";
    google-research/rliable). ``statistic`` maps an (n_boot, n_runs) array to n_boot values.
    Returns (low, high); NaN when a stratum has fewer than two runs (nothing to resample)."""
    import numpy as np

    strata = [np.asarray(x, dtype=float) for x in strata]
    if not strata or any(len(x) < 2 for x in strata):
        return float('nan'), float('nan')
    rng = np.random.default_rng(seed)
    # (n_boot, n_i) per stratum, drawn within it only, then side by side: (n_boot, sum n_i)
    sample = np.concatenate([x[rng.integers(0, len(x), size=(n_boot, len(x)))] for x in strata], axis=1)
    reps = statistic(sample)
    a = (1 - level) / 2
    return float(np.quantile(reps, a)), float(np.quantile(reps, 1 - a))


def t_interval(values, level: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of the Student-t interval of the mean (NaN half-width below two values)."""
    import numpy as np
    from scipy import stats

    x = np.asarray(values, dtype=float)
    mean = float(x.mean()) if len(x) else float('nan')
    if len(x) < 2:
        return mean, float('nan')
    return mean, float(stats.t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
