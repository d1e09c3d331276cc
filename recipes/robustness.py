"""Robustness and calibration beside accuracy: ``zoo test --corruptions`` and the reliability diagram.

Corruption accuracy and the mean corruption error (mCE) follow Hendrycks & Dietterich, "Benchmarking Neural
Network Robustness to Common Corruptions and Perturbations", ICLR 2019 (https://github.com/hendrycks/robustness):
the corruption error of corruption c is its top-1 error summed over the severities, ``CE_c = sum_s E_{c,s}``, and
mCE is the mean over corruptions of ``CE_c / CE_c(reference)``; ImageNet-C's reference is AlexNet, here it is a run
of the user's choosing (``--corruptions-reference``). Without one, ``test_c/ce``, the unnormalised mean corruption
error (mean over corruptions and severities of the top-1 error), is all there is.

Calibration: the expected calibration error (Guo et al., "On Calibration of Modern Neural Networks", ICML 2017),
torchmetrics' ``MulticlassCalibrationError`` (15 bins, L1), and its reliability diagram (accuracy against
confidence per bin, the gap to the diagonal drawn) written as ``reliability.png`` into the run folder.
"""
from __future__ import annotations

from pathlib import Path

import torch
from lightning.pytorch import Callback

__all__ = ['corruption_metrics', 'corruption_table', 'reference_errors', 'calibration_bins', 'reliability_diagram', 'ReliabilityWriter', 'ECE_BINS']

ECE_BINS = 15  # Guo et al.'s and torchmetrics' usual count


def corruption_metrics(acc: dict[tuple[str, int], float], reference: dict[tuple[str, int], float] | None = None
                       ) -> dict[str, float]:
    """The metrics of one corruption evaluation from ``acc[(corruption, severity)]`` (top-1 accuracy in [0, 1]):
    ``test_c/acc1/<c>/<s>``, ``test_c/acc1/<c>`` (mean over severities), ``test_c/acc1`` (mean over all),
    ``test_c/ce`` (the unnormalised mean corruption error, ``1 - test_c/acc1``) and, given the reference's top-1
    errors for the same pairs, ``test_c/mce`` (mean over corruptions of the summed error over severities divided
    by the reference's; 1.0 is as robust as the reference, lower is better)."""
    out: dict[str, float] = {}
    names = list(dict.fromkeys(c for c, _ in acc))
    for (c, s), a in acc.items():
        out[f'test_c/acc1/{c}/{s}'] = float(a)
    for c in names:
        values = [a for (n, _), a in acc.items() if n == c]
        out[f'test_c/acc1/{c}'] = sum(values) / len(values)
    out['test_c/acc1'] = sum(acc.values()) / len(acc)
    out['test_c/ce'] = 1 - out['test_c/acc1']
    if reference is not None:
        ratios = []
        for c in names:
            ours = sum(1 - a for (n, _), a in acc.items() if n == c)
            theirs = sum(reference[(n, s)] for (n, s) in acc if n == c)
            ratios.append(ours / max(theirs, 1e-12))
        out['test_c/mce'] = sum(ratios) / len(ratios)
    return out


def corruption_table(metrics: dict[str, float]) -> str:
    """``zoo test --corruptions``' summary: the clean test metrics, then top-1 accuracy per corruption (rows) and
    severity (columns) with the mean, and the mean corruption error(s)."""
    pairs = [k.split('/')[2:] for k in metrics if k.startswith('test_c/acc1/') and k.count('/') == 3]
    names = list(dict.fromkeys(c for c, _ in pairs))
    sevs = sorted({int(s) for _, s in pairs})
    width = max([len(n) for n in names] + [len('test/acc1')])
    clean = [f'{k} {metrics[k]:.4f}' for k in ('test/acc1', 'test/acc5', 'test/ece', 'test/loss') if k in metrics]
    lines = ['clean: ' + ', '.join(clean), '',
             'top-1 accuracy'.ljust(width) + ''.join(f'{f"s{s}":>8}' for s in sevs) + f'{"mean":>8}']
    for c in names:
        cells = [metrics.get(f'test_c/acc1/{c}/{s}') for s in sevs]
        lines.append(c.ljust(width) + ''.join(f'{v:8.4f}' if v is not None else f'{"-":>8}' for v in cells)
                     + f'{metrics[f"test_c/acc1/{c}"]:8.4f}')
    lines.append('')
    lines.append(f'test_c/acc1 {metrics["test_c/acc1"]:.4f}   test_c/ce {metrics["test_c/ce"]:.4f} (unnormalised mean '
                 f'corruption error)' + (f'   test_c/mce {metrics["test_c/mce"]:.4f} (relative to the reference)'
                                         if 'test_c/mce' in metrics else ''))
    return '\n'.join(lines)


def reference_errors(ref: str, pairs, db=None) -> dict[tuple[str, int], float]:
    """The reference's top-1 error for each (corruption, severity) of ``pairs``, from the results database: ``ref``
    is a run id (``zoo results --data``'s ``run_id``) or a recipe (its file name or stem, as ``zoo test -c``
    takes it), whose newest finished run that recorded all of ``pairs`` is used. A one-line ``ValueError``
    when there is no such run, naming what is missing."""
    from zoo.eval.results import open_db

    store = open_db(db, create=False)
    runs = store.runs(status='finished')
    columns = [f'test_c/acc1/{c}/{s}' for c, s in pairs]
    if str(ref).isdigit():
        chosen = runs[runs['id'] == int(ref)]
        if chosen.empty:
            raise ValueError(f'--corruptions-reference {ref}: no finished run with id {ref} in {store.safe_url}')
    else:
        stem = Path(str(ref)).stem
        recipes = runs['recipe'].fillna('').map(lambda r: [Path(p).stem for p in str(r).split(',')])
        chosen = runs[recipes.map(lambda stems: stem in stems)]
        if chosen.empty:
            raise ValueError(f'--corruptions-reference {ref}: no finished run of recipe {stem} in {store.safe_url}; '
                             f'give a run id or test the reference with zoo test --corruptions first')
        have = chosen[[c for c in columns if c in chosen]].notna().all(axis=1) if all(c in chosen for c in columns) \
            else None
        chosen = chosen[have] if have is not None else chosen.iloc[:0]
        if chosen.empty:
            raise ValueError(f'--corruptions-reference {ref}: no run of recipe {stem} recorded every corruption and '
                             f'severity asked for; test it with the same --corruptions and --severities first')
    row = chosen.iloc[-1]
    missing = [c for c in columns if c not in row or row[c] != row[c]]  # absent or NaN
    if missing:
        raise ValueError(f'--corruptions-reference {ref}: run {int(row["id"])} has no {missing[0]}'
                         + (f' (and {len(missing) - 1} more)' if len(missing) > 1 else '')
                         + '; test it with the same --corruptions and --severities first')
    return {(c, s): 1 - float(row[col]) for (c, s), col in zip(pairs, columns)}


def calibration_bins(confidences: torch.Tensor, correct: torch.Tensor, n_bins: int = ECE_BINS
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(count, accuracy, mean confidence) per bin, binned as torchmetrics' ``MulticlassCalibrationError``: bin k
    holds confidences in [k/n, (k+1)/n), and a confidence of exactly 1 an (n+1)-th bin of its own."""
    conf, hit = confidences.detach().float().cpu(), correct.detach().float().cpu()
    edges = torch.linspace(0, 1, n_bins + 1)
    which = torch.bucketize(conf, edges, right=True) - 1  # bin of each prediction, (N,)
    count = torch.bincount(which, minlength=n_bins + 1).float()
    acc = torch.bincount(which, weights=hit, minlength=n_bins + 1) / count.clamp_min(1)
    mean_conf = torch.bincount(which, weights=conf, minlength=n_bins + 1) / count.clamp_min(1)
    return count, acc, mean_conf


def reliability_diagram(confidences: torch.Tensor, correct: torch.Tensor, path: str | Path,
                        n_bins: int = ECE_BINS, title: str = '') -> Path:
    """A reliability diagram (Guo et al. 2017, fig. 1): per confidence bin (``n_bins`` equal widths over [0, 1],
    as the ECE's), the accuracy as a bar and its gap to the diagonal (the bin's mean confidence) in red; the
    ECE in the corner. Saved through ``zoo.eval.results``' ``save_figure`` (a temporary file, then a rename)."""
    from matplotlib.figure import Figure  # no pyplot: no display or global figure state at test time

    from zoo.eval.results.render import save_figure

    count, acc, mean_conf = calibration_bins(confidences, correct, n_bins)
    ece = float((count / count.sum().clamp_min(1) * (acc - mean_conf).abs()).sum())
    # a confidence of exactly 1 has a bin of its own in torchmetrics (the ECE above counts it so); drawn in the last
    count, acc, mean_conf = (torch.cat([t[:n_bins - 1], t[n_bins - 1:].sum(0, keepdim=True)])
                             for t in (count, acc * count, mean_conf * count))
    acc, mean_conf = acc / count.clamp_min(1), mean_conf / count.clamp_min(1)
    edges = torch.linspace(0, 1, n_bins + 1)
    centres, width = (edges[:-1] + edges[1:]) / 2, 1 / n_bins
    shown = count > 0
    fig = Figure(figsize=(4.5, 4.5))
    ax = fig.subplots()
    ax.bar(centres[shown], acc[shown], width=width, edgecolor='black', label='accuracy')
    # the gap spans accuracy to mean confidence: above the bar when over-confident, inside it when under-confident
    ax.bar(centres[shown], (mean_conf - acc).abs()[shown], bottom=torch.minimum(acc, mean_conf)[shown], width=width,
           color='tab:red', alpha=0.3, hatch='//', edgecolor='tab:red', label='gap to mean confidence')
    ax.plot([0, 1], [0, 1], '--', color='grey', label='perfect calibration')
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel='confidence', ylabel='accuracy', title=title or 'reliability')
    ax.text(0.04, 0.92, f'ECE {ece:.4f} ({n_bins} bins, {int(count.sum())} images)', transform=ax.transAxes)
    ax.legend(loc='upper left', bbox_to_anchor=(0, 0.9), fontsize=8)
    save_figure(fig, path)
    return Path(path)


class ReliabilityWriter(Callback):
    """``zoo test`` of a classifier: ``reliability.png`` in the run folder from the system's ``test_ece`` metric
    (the confidences and hits it gathered over the clean test split), before Lightning resets it."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        from torchmetrics.utilities import dim_zero_cat

        metric = getattr(pl_module, 'test_ece', None)
        if metric is None or trainer.global_rank != 0 or not metric.confidences:
            return
        path = reliability_diagram(dim_zero_cat(metric.confidences), dim_zero_cat(metric.accuracies),
                                   self.run_dir / 'reliability.png', metric.n_bins,
                                   title=f'{getattr(pl_module, "model_name", "")} reliability (test split)')
        from tqdm import tqdm
        tqdm.write(f'zoo test: reliability diagram saved to {path}')
