"""`make demo` ends with the results database's leaderboard. Its latency column is empty right after training (the
end-of-fit record is taken while the machine is still busy, and zoo never publishes such a record), so the demo
says why, and which command fills it, instead of leaving a blank cell unexplained."""
import zoo
from zoo.eval import results as R
from zoo.recipes import demo


def _finished_run(db):
    net = zoo.create('metaformer_tiny', token_mixer='pooling', num_classes=10, in_chans=1)
    rid = db.start_run('metaformer_tiny', task='classification', dataset='digits', seed=0,
                       arch_fingerprint=R.fingerprint(net))
    db.log_metrics(rid, {'val/acc1': 0.9}, final=True)
    db.finish_run(rid)
    return rid, R.fingerprint(net)


def test_the_demo_board_explains_an_empty_latency_and_drops_the_note_once_a_quiet_record_exists(
        tmp_path, monkeypatch, capsys):
    path = tmp_path / 'results.db'
    db = R.open_db(path, create=True)
    rid, fp = _finished_run(db)
    kw = dict(input_shape='1x16x16', batch_size=1, arch_fingerprint=fp, threads=1, cpus=2, repeats=50,
              iqr_ms=0.05)
    db.add_latency('metaformer_tiny', 1.0, source='fit', run_id=rid, load_1m=1.6, **kw)   # 0.8 per CPU: busy
    monkeypatch.setenv('ZOO_DB', str(path))
    monkeypatch.setenv('ZOO_BUSY_LOAD', '0.25')        # the published rule (the suite relaxes it elsewhere)
    demo.leaderboard()
    out = capsys.readouterr().out
    assert 'no trusted latency yet for metaformer_tiny' in out
    assert '`zoo bench metaformer_tiny --db`' in out

    db.add_latency('metaformer_tiny', 1.2, source='bench', load_1m=0.2, **kw)             # 0.1 per CPU: quiet
    demo.leaderboard()
    out = capsys.readouterr().out
    assert 'metaformer_tiny' in out and 'no trusted latency' not in out
