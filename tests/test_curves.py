"""Accuracy against training time (``zoo.eval.results.curves``): synthetic curves with hand-computed answers, a tiny
database written through the ``ResultsDB`` API as recording writes it, the ``train/elapsed_s`` that ``EpochStats``
logs at each validation, and the figure's bytes."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from zoo.eval import results
from zoo.eval.results import curves as C


def curve(times, values, run_id=1) -> pd.DataFrame:
    return pd.DataFrame({'run_id': run_id, 'check': range(len(times)), 'train_s': times, 'value': values})


# ------------------------------------------------------------------------------------------ one run's curve
def test_value_at_time_interpolates_inside_the_span_and_never_extrapolates():
    c = curve([1.0, 3.0, 5.0], [0.2, 0.6, 0.7])
    assert C.value_at_time(c, 2.0) == pytest.approx(0.4)
    assert C.value_at_time(c, 4.0) == pytest.approx(0.65)
    assert C.value_at_time(c, 1.0) == pytest.approx(0.2) and C.value_at_time(c, 5.0) == pytest.approx(0.7)
    assert math.isnan(C.value_at_time(c, 0.5))        # before the first check nothing is known
    assert math.isnan(C.value_at_time(c, 5.01))       # after the last: no extrapolation
    assert math.isnan(C.value_at_time(curve([], []), 1.0))


def test_time_to_target_between_checks_first_check_and_never():
    c = curve([1.0, 3.0, 5.0], [0.2, 0.6, 0.7])
    assert C.time_to_target(c, 0.5) == pytest.approx(2.5)          # 1 + (0.5 - 0.2) / (0.6 - 0.2) * 2
    assert C.time_to_target(c, 0.6) == pytest.approx(3.0)          # reached exactly at a check
    assert C.time_to_target(c, 0.1) == pytest.approx(1.0)          # the first check is already past it
    assert math.isnan(C.time_to_target(c, 0.8))                     # never reached
    # the first crossing counts, not a later one after a dip
    assert C.time_to_target(curve([1, 2, 3, 4], [0.2, 0.6, 0.4, 0.9]), 0.5) == pytest.approx(1.75)
    # lower is better: a loss reaching 0.8 between 1.0 at 2 s and 0.5 at 4 s -> 2 + 0.4 * 2
    loss = curve([1.0, 2.0, 4.0], [2.0, 1.0, 0.5])
    assert C.time_to_target(loss, 0.8, higher_is_better=False) == pytest.approx(2.8)
    assert math.isnan(C.time_to_target(loss, 0.4, higher_is_better=False))


def test_entry_band_is_the_mean_and_range_where_every_seed_was_measured():
    runs = pd.concat([curve([1.0, 3.0], [0.0, 1.0], run_id=1), curve([2.0, 4.0], [1.0, 0.0], run_id=2)])
    grid, mean, low, high = C.entry_band(runs, [0, 1, 2, 3, 4, 5])
    # run 1 on the grid: -, 0, 0.5, 1, -, -; run 2: -, -, 1, 0.5, 0, -; both only at 2 and 3
    assert np.array_equal(np.isnan(mean), [True, True, False, False, True, True])
    assert mean[2:4] == pytest.approx([0.75, 0.75])
    assert low[2:4] == pytest.approx([0.5, 0.5]) and high[2:4] == pytest.approx([1.0, 1.0])
    assert np.isnan(low[[0, 1, 4, 5]]).all() and np.isnan(high[[0, 1, 4, 5]]).all()
    one = C.entry_band(curve([1.0, 3.0], [0.0, 1.0]), [2.0])
    assert (one[1][0], one[2][0], one[3][0]) == pytest.approx((0.5, 0.5, 0.5))   # one seed: a band of no width


def test_group_target_equal_time_and_per_entry_summary():
    assert C.default_target({'a': [0.8, 0.9], 'b': [0.6]}) == pytest.approx(0.95 * 0.85)
    assert C.default_target({'a': [2.0, 4.0], 'b': [1.0]}, higher_is_better=False) == pytest.approx(1.05)
    assert math.isnan(C.default_target({'a': []}))
    df = pd.concat([curve([1, 2, 3], [0.2, 0.6, 0.8], 1), curve([1, 2, 4], [0.2, 0.4, 0.8], 2),
                    curve([1, 2, 5], [0.1, 0.2, 0.3], 3),                                 # entry a
                    curve([2, 6], [0.1, 0.9], 4), curve([2, 8], [0.3, 0.3], 5)])          # entry b
    assert C.equal_time(df) == 3.0                               # the shortest run ends at 3 s
    s = C.entry_summary(df, {'a': [1, 2, 3], 'b': [4, 5]}, target=0.5, at_time=3.0).set_index('entry')
    # a reaches 0.5 at 1.75 s and 2.5 s, run 3 never: the median of (1.75, 2.5, never) is 2.5
    assert s.loc['a', 'time_to_target'] == pytest.approx(2.5) and s.loc['a', 'reached'] == 2
    assert s.loc['a', 'final'] == pytest.approx((0.8 + 0.8 + 0.3) / 3)
    assert s.loc['a', 'train_s'] == pytest.approx(4.0)
    assert s.loc['a', 'value_at_time'] == pytest.approx((0.8 + 0.6 + (0.2 + 1 / 3 * 0.1)) / 3)
    # b: one of two seeds reaches it (at 2 + 0.5 * 4 = 4 s): the median counts the other as later -> none
    assert math.isnan(s.loc['b', 'time_to_target']) and s.loc['b', 'reached'] == 1
    assert s.loc['b', 'value_at_time'] == pytest.approx((0.1 + 0.8 / 4 + 0.3) / 2)       # 0.3 and 0.3
    rows = C.curve_table(s.reset_index(), 'val/acc1', 0.5, 3.0)
    assert rows[0] == {'entry': 'a', 'seeds': '3', 'final val/acc1': '0.6333', 'training s': '4.0', 's to 0.5': '2.5',
                       'reached': '2/3', 'val/acc1 at 3.0 s': '0.5444'}
    assert rows[1]['s to 0.5'] == '—' and rows[1]['reached'] == '1/2'
    late = C.entry_summary(df, {'b': [4, 5]}, target=0.5, at_time=1.5)       # before b's first check
    assert math.isnan(late.value_at_time[0]) and late.seeds_at_time[0] == 0
    assert C.curve_table(late, 'val/acc1', 0.5, 1.5)[0]['val/acc1 at 1.5 s'] == 'no check yet'


# ---------------------------------------------------------------------------------- from a results database
def test_curves_from_a_database_written_as_recording_writes_it(tmp_path):
    store = results.ResultsDB(str(tmp_path / 'r.db'))
    try:
        # an epoch-based run: validation at each epoch's end; epoch 2 validated but never ended (no time)
        a = store.start_run('m', task='classification', dataset='d', seed=0)
        for epoch, (seconds, acc) in enumerate([(2.0, 0.5), (3.0, 0.7)]):
            step = 10 * epoch + 9
            store.log_metrics(a, {'val/acc1': acc, 'train/epoch_time_s': seconds}, epoch=epoch, step=step)
        store.log_metrics(a, {'val/acc1': 0.9}, epoch=2, step=29)
        store.log_metrics(a, {'val/acc1': 0.9}, final=True)          # final rows are not checks
        # a step-based run (val_check_interval 200 in one epoch of 600 steps), recorded before train/elapsed_s
        b = store.start_run('m', task='classification', dataset='d', seed=1)
        for step, acc in ((199, 0.2), (399, 0.4), (599, 0.8)):
            store.log_metrics(b, {'val/acc1': acc}, epoch=0, step=step)
        store.log_metrics(b, {'train/epoch_time_s': 12.0}, epoch=0, step=599)
        # the same with train/elapsed_s logged at each check (EpochStats now): measured times are preferred
        c = store.start_run('m', task='classification', dataset='d', seed=2)
        for step, acc, t in ((199, 0.3, 3.0), (399, 0.6, 7.5), (599, 0.7, 12.5)):
            store.log_metrics(c, {'val/acc1': acc, 'train/elapsed_s': t}, epoch=0, step=step)
        store.log_metrics(c, {'train/epoch_time_s': 12.5}, epoch=0, step=599)
        # a check in the second epoch of a multi-epoch step-based run: 3 s + 5 s * (14 - 9) / (19 - 9)
        d = store.start_run('m', task='classification', dataset='d', seed=3)
        store.log_metrics(d, {'val/acc1': 0.1, 'train/epoch_time_s': 3.0}, epoch=0, step=9)
        store.log_metrics(d, {'val/acc1': 0.3}, epoch=1, step=14)
        store.log_metrics(d, {'val/acc1': 0.5, 'train/epoch_time_s': 5.0}, epoch=1, step=19)

        df = C.curves(store, [a, b, c, d], 'val/acc1')
        assert list(df.columns) == C.CURVE_COLUMNS
        got = {r: (list(g.train_s), list(g.value), list(g.time_from)) for r, g in df.groupby('run_id')}
        assert got[a] == ([2.0, 5.0], [0.5, 0.7], ['epochs', 'epochs'])
        assert got[b][0] == pytest.approx([4.0, 8.0, 12.0]) and got[b][2] == ['steps', 'steps', 'epochs']
        assert got[c] == ([3.0, 7.5, 12.5], [0.3, 0.6, 0.7], ['elapsed'] * 3)
        assert got[d][0] == pytest.approx([3.0, 5.5, 8.0])
        assert list(df[df.run_id == b].check) == [0, 1, 2]

        g = C.group_curves(store, {'x': [b, c], 'y': [a]}, 'val/acc1')
        assert g.higher_is_better and g.target == pytest.approx(0.95 * 0.75)   # best mean final: x, (0.8+0.7)/2
        assert g.equal_time == 5.0                                             # run a ends at 5 s
        x = g.summary.set_index('entry').loc['x']
        assert x.value_at_time == pytest.approx((0.2 + 0.2 / 4 + 0.3 + 0.3 * 2 / 4.5) / 2)
        assert [r['entry'] for r in g.table] == ['x', 'y']
        grid, mean, low, high = g.bands['x']
        assert np.isnan(mean[grid < 4.0]).all() and not np.isnan(mean[(grid >= 4.0) & (grid <= 12.0)]).any()
        with pytest.raises(results.ResultsDBError, match="no validation check of 'val/map'"):
            C.group_curves(store, {'x': [a]}, 'val/map')
    finally:
        store.close()


def test_epoch_stats_logs_the_training_time_at_each_validation(tmp_path):
    """A fit validating twice per epoch records train/elapsed_s with each check, and curves reads it."""
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel

    from zoo.recipes.recording import EpochStats, ResultsLogger

    class Model(BoringModel):
        def validation_step(self, batch, batch_idx):
            loss = self.step(batch)
            self.log('val/loss', loss)
            return loss

    logger = ResultsLogger(db=str(tmp_path / 'r.db'), latency=False)
    trainer = pl.Trainer(max_epochs=2, limit_train_batches=6, val_check_interval=3, limit_val_batches=2,
                         callbacks=[EpochStats()], logger=logger, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=1)
    trainer.fit(Model())
    store = results.open_db(str(tmp_path / 'r.db'))
    df = C.curves(store, [logger.run_id], 'val/loss')
    assert list(df.step) == [2, 5, 8, 11] and (df.time_from == 'elapsed').all()
    assert (np.diff(df.train_s) > 0).all()
    epochs = store.metrics(logger.run_id, name='train/epoch_time_s', final=False).value.to_numpy()
    # the check at the end of epoch 0 comes before that epoch's end hook: at most the epoch's time
    assert 0 < df.train_s[1] <= epochs[0] and df.train_s[3] <= epochs.sum()
    assert df.train_s[2] > epochs[0]                        # epoch 1's first check counts epoch 0 in full
    results.close_all()


# ------------------------------------------------------------------------------------------------ the figure
def test_plot_curves_svg_is_byte_identical_on_two_writes(tmp_path):
    df = pd.concat([curve([1, 2, 3], [0.2, 0.6, 0.8], 1), curve([1.2, 2.1, 3.3], [0.3, 0.5, 0.7], 2),
                    curve([2, 4], [0.1, 0.9], 3)])
    grid = C.time_grid(df, 50)
    bands = {'a': C.entry_band(df[df.run_id.isin([1, 2])], grid), 'b': C.entry_band(df[df.run_id == 3], grid)}
    paths = [tmp_path / 'one.svg', tmp_path / 'two.svg']
    for p in paths:
        C.plot_curves(bands, p, 'group', 'val/acc1', target=0.7, equal_time=3.0)
    first = paths[0].read_bytes()
    assert first.startswith(b'<?xml') and first == paths[1].read_bytes()
    assert not list(tmp_path.glob('.*.tmp'))                 # written through a temporary file, renamed
    C.plot_curves(bands, tmp_path / 'three.svg', 'group', 'val/acc1')     # no target: another figure
    assert (tmp_path / 'three.svg').read_bytes() != first
