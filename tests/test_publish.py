"""`zoo publish` (a trained run as a Hugging Face model folder), `zoo.create('local-dir:' | 'hf-hub:')` and
`zoo weights`, offline: a tiny run trained here, its folder loaded back from disk and from a Hugging Face cache
built in tmp_path with HF_HUB_OFFLINE=1, the card's numbers compared with the results database's. Uploading
cannot be tested without the network: only that `--push` refuses without a token and what it hands to
`HfApi.upload_folder`."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from zoo_cli import error_line, zoo_in_process

import zoo
from zoo.eval import results
from zoo.recipes.main import DEMO

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.xdist_group('test_publish')   # one worker: the module fixture trains once
FAST = ['--trainer.max_epochs', '1', '--trainer.limit_train_batches', '2', '--trainer.limit_val_batches', '1',
        '--trainer.enable_progress_bar', 'false']
REPEATS = {1: 0.5, 2: 0.75}     # seed -> final val/acc1 of two more runs of the same configuration


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    """One fit of the demo recipe with an EMA (two steps), then two seed-repeats and a latency record added to its
    results database through the store's API, as further `zoo fit --seeds` and `zoo bench --db` would."""
    cwd = tmp_path_factory.mktemp('publish')
    proc = zoo_in_process('fit', '-c', str(ROOT / DEMO), *FAST, '--model.ema_decay', '0.5', cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = results.open_db(cwd / 'zoo-results.db')
    [mine] = store.runs().to_dict('records')
    for seed, value in REPEATS.items():
        rid = store.start_run(mine['model'], task=mine['task'], dataset=mine['dataset'], stage='fit',
                              config_key=mine['config_key'], seed=seed, hparams=mine['hparams'],
                              max_epochs=mine['max_epochs'])
        store.log_metrics(rid, {'val/acc1': value}, final=True)
        store.finish_run(rid)
    store.add_latency(mine['model'], 1.25, input_shape=(1, 32, 32), batch_size=1, run_id=mine['id'], threads=1,
                      iqr_ms=0.05, repeats=30, source='bench', load_1m=0.0, cpus=2, cpu_model='Test CPU 9000')
    results.close_all()
    return cwd


def _ckpt(cwd: Path) -> Path:
    [best] = (cwd / 'runs' / Path(DEMO).stem / 'latest' / 'checkpoints').glob('best*.ckpt')
    return best


def _publish(cwd: Path, out: str = 'card', *extra: str):
    return zoo_in_process('publish', '-c', str(ROOT / DEMO), '--ckpt_path', 'best', '--out', out, *extra, cwd=cwd)


@pytest.fixture(scope='module')
def folder(run):
    proc = _publish(run)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run / 'card'


def test_folder_loads_back_with_the_evaluated_weights(folder, run):
    """local-dir: gives the network zoo.create(checkpoint=best.ckpt) gives (the EMA weights), same outputs."""
    assert sorted(p.name for p in folder.iterdir()) == ['README.md', 'config.json', 'eval_results.yaml',
                                                        'model.safetensors']
    config = json.loads((folder / 'config.json').read_text())
    assert config['architecture'] == 'poolformer_tiny' and config['weights'] == 'ema'
    assert config['pretrained_cfg']['input_size'] == [1, 32, 32] and len(config['pretrained_cfg']['mean']) == 1
    assert config['model_args']['num_classes'] == config['num_classes'] == 10
    ref = zoo.create(config['architecture'], checkpoint=str(_ckpt(run)),
                     **{k: v for k, v in config['model_args'].items()}).eval()
    assert ref.zoo_weights == 'ema'
    model = zoo.create(f'local-dir:{folder}').eval()
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), ref(x))
    assert model.pretrained_cfg['mean'] == tuple(config['pretrained_cfg']['mean'])
    assert zoo.create(f'local-dir:{folder}', num_classes=3).get_classifier().out_features == 3


def test_hf_hub_name_loads_from_an_offline_cache(folder, tmp_path, monkeypatch):
    """hf-hub:ORG/NAME goes through huggingface_hub.snapshot_download: with HF_HUB_OFFLINE=1 it is answered from the
    cache (the Hub's documented layout: models--ORG--NAME/snapshots/<commit>/, refs/main), and a name not in it is
    one error."""
    import huggingface_hub

    cache = tmp_path / 'hub'
    commit = 'a' * 40
    repo = cache / 'models--my-org--tiny-digits'
    shutil.copytree(folder, repo / 'snapshots' / commit)
    (repo / 'refs').mkdir()
    (repo / 'refs' / 'main').write_text(commit)
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setenv('HF_HUB_CACHE', str(cache))
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_OFFLINE', True)
    monkeypatch.setattr(huggingface_hub.constants, 'HF_HUB_CACHE', str(cache))
    model = zoo.create('hf-hub:my-org/tiny-digits').eval()
    local = zoo.create(f'local-dir:{folder}').eval()
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), local(x))
    assert model.pretrained_cfg['hf_hub_id'] == 'my-org/tiny-digits'
    with pytest.raises(FileNotFoundError, match='HF_HUB_OFFLINE=1') as e:
        zoo.create('hf-hub:my-org/not-cached')
    assert '\n' not in str(e.value)


@pytest.mark.parametrize('name, error, expected', [
    ('hf-hub:', ValueError, "expected 'hf-hub:ORG/NAME'"),
    ('hf-hub:just-a-name', ValueError, "expected 'hf-hub:ORG/NAME'"),
    ('local-dir:', ValueError, 'needs a folder'),
    ('local-dir:{tmp}/missing', FileNotFoundError, 'no such folder'),
    ('local-dir:{tmp}', FileNotFoundError, 'has no config.json'),
])
def test_bad_folder_names_are_one_line(name, error, expected, tmp_path):
    with pytest.raises(error, match=expected) as e:
        zoo.create(name.format(tmp=tmp_path))
    assert '\n' not in str(e.value)


def test_card_numbers_are_the_databases(folder, run):
    """The card and eval_results.yaml: the mean over the three seeds and its Student-t interval, params, MACs and
    the latency record with its CPU, as the results database holds them."""
    df = results.data(db=run / 'zoo-results.db')
    results.close_all()
    [mine] = df[df.seed == 0].to_dict('records')
    values = [mine['val/acc1'], *REPEATS.values()]
    mean = float(np.mean(values))
    half = results.t_interval(values)[1]
    index = yaml.safe_load((folder / 'eval_results.yaml').read_text())
    [entry] = index['model-index']
    [result] = entry['results']
    assert result['task'] == {'type': 'image-classification'}
    assert result['dataset'] == {'name': 'digits', 'type': 'digits'}
    [metric] = result['metrics']
    assert metric['type'] == 'accuracy' and metric['value'] == pytest.approx(mean, abs=1e-12)
    assert f'[{mean - half:.4f}, {mean + half:.4f}]' in metric['name'] and '3 seeds' in metric['name']
    card = (folder / 'README.md').read_text()
    front = yaml.safe_load(card.split('---')[1])
    assert front['library_name'] == 'zoo' and front['license'] == 'apache-2.0' and 'poolformer' in front['tags']
    assert front['model-index'] == index['model-index']
    assert f'| val/acc1, this run (seed 0) | {mine["val/acc1"]:.4f} |' in card
    assert f'| val/acc1, mean over seeds | {mean:.4f} |' in card
    def recorded(v):
        return 'not recorded' if v is None or v != v else str(int(v))
    assert f'| params | {recorded(mine["params"])} |' in card and f'| MACs | {recorded(mine["macs"])}' in card
    assert 'Test CPU 9000' in card and '| eager | 1.250 | 0.050 |' in card
    assert 'no field for an interval' in card and 'zoo fit -c' in card


def test_a_non_empty_folder_is_not_replaced_without_force(folder, run):
    before = (folder / 'model.safetensors').read_bytes()
    (folder / 'notes.txt').write_text('mine')
    proc = _publish(run)
    assert proc.returncode == 2 and 'not empty' in error_line(proc) and '--force' in error_line(proc)
    assert (folder / 'notes.txt').read_text() == 'mine' and (folder / 'model.safetensors').read_bytes() == before
    proc = _publish(run, 'card', '--force')
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (folder / 'notes.txt').exists() and (folder / 'config.json').is_file()
    assert not [p for p in run.iterdir() if p.name.startswith('.card.')]   # no temporary folder left


def test_push_needs_a_token_and_uploads_the_folder(run, monkeypatch):
    import huggingface_hub

    monkeypatch.delenv('HF_TOKEN', raising=False)
    monkeypatch.setattr(huggingface_hub, 'get_token', lambda: None)
    proc = zoo_in_process('publish', '-c', str(ROOT / DEMO), '--push', 'my-org/tiny-digits', cwd=run)
    assert proc.returncode == 2 and 'HF_TOKEN' in error_line(proc)

    calls = []

    class FakeApi:
        def __init__(self, token=None):
            calls.append(('init', token))

        def create_repo(self, repo_id, **kw):
            calls.append(('create_repo', repo_id, kw))

        def upload_folder(self, **kw):
            calls.append(('upload_folder', kw, sorted(p.name for p in Path(kw['folder_path']).iterdir())))

    monkeypatch.setattr(huggingface_hub, 'get_token', lambda: 'hf_test')
    monkeypatch.setattr(huggingface_hub, 'HfApi', FakeApi)
    proc = zoo_in_process('publish', '-c', str(ROOT / DEMO), '--push', 'my-org/tiny-digits', cwd=run)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert calls[0] == ('init', 'hf_test') and calls[1][:2] == ('create_repo', 'my-org/tiny-digits')
    _, kw, files = calls[2]
    assert kw['repo_id'] == 'my-org/tiny-digits' and kw['repo_type'] == 'model'
    assert files == ['README.md', 'config.json', 'eval_results.yaml', 'model.safetensors']
    assert not Path(kw['folder_path']).exists()       # the temporary folder is removed after the upload


def test_weights_lists_released_files_and_verifies_one(tmp_path, monkeypatch, capsys):
    """`zoo weights`: the registry's released files (URL, "hash unknown" where no source gives one); --verify loads
    the file strictly and checks a known hash; an unknown name is one line with close matches."""
    from zoo import _registry
    from zoo.recipes.main import main

    assert main(['weights', 'poolformer_s12']) == 0
    line = capsys.readouterr().out.strip()
    assert 'https://github.com/sail-sg/poolformer/releases/download/v1.0/poolformer_s12.pth.tar' in line
    assert 'hash unknown' in line
    assert main(['weights', 'poolformer_s1']) == 2
    assert "did you mean 'poolformer_s12'" in capsys.readouterr().err.lower()

    # --verify on the tiny variant (a full-size model is seconds to build): given a release record for the test
    tiny = zoo.model_info('poolformer_tiny')
    release = zoo.ReleasedWeights('https://example.invalid/poolformer_tiny.pth')
    monkeypatch.setitem(_registry._MODELS, 'poolformer_tiny', dataclasses.replace(tiny, weights=(release,)))
    good = tmp_path / 'poolformer_tiny.pth'
    torch.save(zoo.create('poolformer_tiny').state_dict(), good)
    assert main(['weights', 'poolformer_tiny', '--verify', str(good)]) == 0
    out = capsys.readouterr().out
    assert 'OK' in out and 'hash unknown' in out
    wrong = tmp_path / 'three_classes.pth'
    torch.save(zoo.create('poolformer_tiny', num_classes=3).state_dict(), wrong)
    assert main(['weights', 'poolformer_tiny', '--verify', str(wrong)]) == 2
    err = capsys.readouterr().err.strip()
    assert 'does not load into poolformer_tiny' in err and '\n' not in err

    from zoo.recipes.distill import file_sha256
    known = dataclasses.replace(release, sha256=file_sha256(good, hex_chars=None))
    monkeypatch.setitem(_registry._MODELS, 'poolformer_tiny', dataclasses.replace(tiny, weights=(known,)))
    assert main(['weights', 'poolformer_tiny', '--verify', str(good)]) == 0
    assert 'sha256 matches' in capsys.readouterr().out
    assert main(['weights', 'poolformer_tiny', '--verify', str(wrong)]) == 2
    assert 'is not the released file' in capsys.readouterr().err
