"""Runs launched outside Lightning (issue 15, item 12): under ``torchrun`` or ``srun`` every rank uses rank 0's
run folder, so a DDP job leaves one run folder, one checkpoint set, one results-database row, and validation
metrics reduced over all ranks.

The launches are real: two CPU processes on the gloo backend, started by ``torch.distributed.run`` and, for
SLURM, by this test with the variables ``srun`` sets (no SLURM installation here: Lightning's
``SLURMEnvironment`` reads only those variables, so the code path is the one a cluster takes, but ``srun``
itself, several nodes and a shared file system between them are not exercised).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zoo.eval import results
from zoo.recipes.runs import external_launch

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / 'recipes' / 'configs' / 'poolformer' / 'poolformer_tiny_digits_15e.yaml'
# 180 validation images (val_fraction 0.1): even, so the DistributedSampler splits them 90/90 without padding
# (with an odd count it repeats one image to even the shares, and the metric would count it twice).
VAL_FRACTION = 0.1
ARGS = ['fit', '-c', str(DEMO), '--seed_everything', '0', '--trainer.max_epochs', '2',
        '--trainer.limit_train_batches', '3', '--trainer.accelerator', 'cpu', '--trainer.devices', '2',
        '--trainer.strategy', 'ddp', '--trainer.enable_progress_bar', 'false',
        '--trainer.enable_model_summary', 'false', '--data.init_args.val_fraction', str(VAL_FRACTION)]


def _env(tmp_path: Path) -> dict:
    env = {**os.environ, 'ZOO_RUNS': str(tmp_path / 'runs'), 'ZOO_DB': str(tmp_path / 'results.db'),
           'OMP_NUM_THREADS': '1', 'PYTHONPATH': str(ROOT)}
    for k in [k for k in env if k.startswith(('SLURM_', 'TORCHELASTIC_')) or k in (
            'ZOO_RUN_DIR', 'RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')]:
        env.pop(k)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _torchrun(tmp_path: Path, args: list[str] = ARGS) -> None:
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2',
           '-m', 'zoo.recipes.main', *args]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _srun(tmp_path: Path, args: list[str] = ARGS, check: bool = True) -> list[tuple[int, str]]:
    """What ``srun --ntasks-per-node=2 zoo fit ...`` starts on one node: two processes that differ only in
    ``SLURM_PROCID``/``SLURM_LOCALID``."""
    env = {**_env(tmp_path), 'SLURM_JOB_ID': '4242', 'SLURM_JOB_NAME': 'zoo', 'SLURM_NTASKS': '2',
           'SLURM_NTASKS_PER_NODE': '2', 'SLURM_NNODES': '1', 'SLURM_NODEID': '0',
           'SLURM_NODELIST': '127.0.0.1', 'MASTER_PORT': str(_free_port())}
    procs = [subprocess.Popen([sys.executable, '-m', 'zoo.recipes.main', *args], cwd=tmp_path,
                              env={**env, 'SLURM_PROCID': str(r), 'SLURM_LOCALID': str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [(p.communicate(timeout=600)[1], p.returncode) for p in procs]
    for rank, (err, code) in enumerate(outs):
        assert code == 0 or not check, f'rank {rank} exited {code}: ' + err[-3000:]
    if check:  # rank 0 alone writes the manifest (srun sets no LOCAL_RANK: both ranks once raced on its file)
        newest = max((tmp_path / 'runs').rglob('run.json'), key=lambda m: m.parent.name)
        assert json.loads(newest.read_text())['pid'] == procs[0].pid, newest
    return [(code, err) for err, code in outs]


def _whole_val_set_accuracy(ckpt: Path) -> tuple[float, float]:
    """The checkpoint's top-1 accuracy over the whole validation set, in this process (no Lightning, no
    reduction), and over rank 0's share alone (what an unreduced metric would report)."""
    from zoo.datasets import DigitsDataModule
    from zoo.recipes import ImageClassifier

    system = ImageClassifier.load_from_checkpoint(ckpt, map_location='cpu').eval()
    dm = DigitsDataModule(img_size=32, batch_size=64, val_fraction=VAL_FRACTION)
    dm.setup('validate')
    correct = []
    with torch.no_grad():
        for x, y in dm.val_dataloader():
            correct.append(system.eval_model(x).argmax(-1) == y)
    correct = torch.cat(correct).float()
    assert len(correct) == 180
    return correct.mean().item(), correct[0::2].mean().item()  # DistributedSampler: rank 0 takes 0, 2, 4, ...


@pytest.mark.slow
@pytest.mark.parametrize('launch', [_torchrun, _srun], ids=['torchrun', 'srun'])
def test_a_ddp_job_leaves_one_run_one_checkpoint_set_one_row_and_reduced_metrics(tmp_path, launch):
    launch(tmp_path)
    stem = tmp_path / 'runs' / DEMO.stem
    folders = sorted(p for p in stem.iterdir() if p.is_dir() and not p.is_symlink())
    assert len(folders) == 1, folders                                     # rank 1 made no folder of its own
    run = folders[0]
    assert (stem / 'latest').resolve() == run.resolve()
    ckpts = sorted(p.name for p in (run / 'checkpoints').iterdir())
    assert len(ckpts) == 2 and 'last.ckpt' in ckpts and ckpts[0].startswith('best-'), ckpts
    assert (run / 'config.yaml').is_file() and (run / 'metrics.csv').is_file()

    db = str(tmp_path / 'results.db')
    rows = results.runs(db=db)
    assert len(rows) == 1, rows[['id', 'model', 'status']]                # only global rank 0 writes
    row = rows.iloc[0]
    assert row['status'] == 'finished' and row['env']['strategy'] == 'DDPStrategy'
    assert len(results.latency(db=db)) == 1                               # measured once, by rank 0

    # The final val/acc1 (epoch 1, the weights of last.ckpt) is the accuracy over all 180 images, not over
    # rank 0's 90; the assertion on the share shows that this check tells the two apart.
    whole, share = _whole_val_set_accuracy(run / 'checkpoints' / 'last.ckpt')
    assert whole != share
    assert row['val/acc1'] == pytest.approx(whole, abs=1e-6)
    final = results.metrics(int(row['id']), db=db, name='val/acc1', final=True)
    assert final['value'].tolist() == pytest.approx([whole], abs=1e-6)

    if launch is _srun:  # a requeued job: every rank resolves --ckpt_path last to the same file and goes on
        launch(tmp_path, [*ARGS, '--trainer.max_epochs', '3', '--ckpt_path', 'last'])
        folders = sorted(p for p in stem.iterdir() if p.is_dir() and not p.is_symlink())
        assert len(folders) == 2 and folders[0] == run and (stem / 'latest').resolve() == folders[1].resolve()
        last = torch.load(folders[1] / 'checkpoints' / 'last.ckpt', map_location='cpu', weights_only=False)
        assert (last['epoch'], last['global_step']) == (2, 9)             # epochs 0-1 from the first job
        assert len(results.runs(db=db)) == 2


@pytest.mark.slow
def test_seeds_under_torchrun_give_one_folder_and_one_row_per_seed(tmp_path):
    """``zoo fit --seeds 0,1`` runs two fits in one launch: each gets its own folder, shared by both ranks
    (the second fit reuses the process group), and its own run row."""
    _torchrun(tmp_path, [*ARGS, '--trainer.max_epochs', '1', '--trainer.limit_train_batches', '1',
                         '--trainer.limit_val_batches', '1', '--seeds', '0,1'])
    stem = tmp_path / 'runs' / DEMO.stem
    folders = sorted(p for p in stem.iterdir() if p.is_dir() and not p.is_symlink())
    assert len(folders) == 2, folders
    for run in folders:
        assert sorted(p.name.split('-')[0] for p in (run / 'checkpoints').iterdir()) == ['best', 'last.ckpt']
    rows = results.runs(db=str(tmp_path / 'results.db'))
    assert sorted(rows['seed']) == [0, 1] and set(rows['status']) == {'finished'}


@pytest.mark.slow
def test_language_model_accuracy_counts_every_rank(tmp_path, monkeypatch):
    """CausalLM counts exact answers and tokens itself (not torchmetrics): a 2-process `zoo validate` must
    report the counts of both ranks added up, i.e. what one process reports over the whole split (128
    windows, 64 per rank). The untrained model gets about 1 token in 67 right, so each rank's share alone
    gives another token accuracy than the whole (about 30 hits in 2,000 tokens per rank)."""
    lm = ROOT / 'recipes' / 'configs' / 'lm' / 'llama_tiny_copy.yaml'
    args = ['validate', '-c', str(lm), '--data.init_args.train_windows', '64', '--trainer.enable_progress_bar',
            'false', '--trainer.enable_model_summary', 'false']
    _srun(tmp_path, [*args, '--trainer.devices', '2', '--trainer.strategy', 'ddp'])
    [ddp] = results.runs(db=str(tmp_path / 'results.db')).to_dict('records')

    from zoo.recipes.main import main
    monkeypatch.setenv('ZOO_RUNS', str(tmp_path / 'one'))
    assert main([*args, '--db', str(tmp_path / 'one.db')]) == 0
    [one] = results.runs(db=str(tmp_path / 'one.db')).to_dict('records')
    assert ddp['env']['devices'] == 2 and one['env']['devices'] == 1
    assert ddp['val/token_acc'] == pytest.approx(one['val/token_acc'], abs=1e-9)
    assert ddp['val/acc'] == pytest.approx(one['val/acc'], abs=1e-9)
    assert ddp['val/loss'] == pytest.approx(one['val/loss'], rel=1e-5)


def test_a_launch_the_trainer_does_not_expect_is_refused(tmp_path):
    """Two SLURM tasks and the recipe's ``devices: 1``: Lightning would train two independent single-device
    runs, each as rank 0, in one folder. Both processes stop at once with one line and exit code 2."""
    args = [*ARGS, '--trainer.devices', '1', '--trainer.strategy', 'auto']
    for code, err in _srun(tmp_path, args, check=False):
        assert code == 2, err[-3000:]
        assert ('zoo fit: error: SLURM started 2 processes but the trainer expects devices x num_nodes = 1 x 1; '
                'pass --trainer.devices') in err
        assert 'Traceback' not in err
    assert not (tmp_path / 'runs').exists() and not (tmp_path / 'results.db').exists()


def test_only_a_multi_process_torchrun_or_srun_launch_shares_rank_0s_folder(monkeypatch):
    """The detection ``ZooCLI`` relies on, from the variables torchrun and srun set."""
    for k in [k for k in os.environ if k.startswith(('SLURM_', 'TORCHELASTIC_'))] + ['RANK', 'WORLD_SIZE']:
        monkeypatch.delenv(k, raising=False)
    assert external_launch() is None                                      # a plain `zoo fit`

    monkeypatch.setenv('TORCHELASTIC_RUN_ID', 'none')                     # torchrun's default run id
    monkeypatch.setenv('WORLD_SIZE', '1')
    monkeypatch.setenv('RANK', '0')
    assert external_launch() is None                                      # one process: nothing to share
    monkeypatch.setenv('WORLD_SIZE', '4')
    monkeypatch.setenv('RANK', '3')
    env = external_launch()
    assert type(env).__name__ == 'TorchElasticEnvironment' and env.global_rank() == 3
    monkeypatch.delenv('TORCHELASTIC_RUN_ID')

    for k, v in {'SLURM_NTASKS': '8', 'SLURM_NTASKS_PER_NODE': '4', 'SLURM_PROCID': '5', 'SLURM_LOCALID': '1',
                 'SLURM_NODEID': '1', 'SLURM_JOB_ID': '123', 'SLURM_JOB_NAME': 'train'}.items():
        monkeypatch.setenv(k, v)
    env = external_launch()
    assert type(env).__name__ == 'SLURMEnvironment'
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (8, 5, 1, 1)
    monkeypatch.setenv('SLURM_JOB_NAME', 'interactive')   # Lightning's opt-out: processes started by hand in salloc
    assert external_launch() is None
    monkeypatch.setenv('SLURM_JOB_NAME', 'train')
    monkeypatch.setenv('SLURM_NTASKS', '1')                # one task (Lightning may launch the others itself)
    monkeypatch.setenv('SLURM_NTASKS_PER_NODE', '1')
    assert external_launch() is None
