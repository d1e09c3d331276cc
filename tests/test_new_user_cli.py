"""Issue 42, defect 6, the command-line half of defect 8 and the CLI's rough edges, through the command line as a
new user meets them: a recipe given another task's data, and bad input found once a run has started (before its
first training step), are one line, exit 2 and leave nothing (no run folder, no results row, ``latest`` where it
was); ``zoo list | head`` ends quietly; ``--runtime onnx`` suggests ``onnxruntime``; the fit summary counts the
network once, not with its EMA copy."""
from __future__ import annotations

import json
import os
import re

import pytest
from zoo_cli import db_runs, error_line, tree, zoo, zoo_in_process

RECIPE = 'poolformer/poolformer_tiny_digits_15e'
STEM = 'poolformer_tiny_digits_15e'
QUIET = ['--trainer.enable_progress_bar=false', '--trainer.enable_model_summary=false']


# ---------------------------------------------------------------------------------- defect 6: another task's data
def test_a_recipe_given_another_tasks_data_is_one_line_and_leaves_nothing(tmp_path):
    proc = zoo('fit', '-c', 'detection/yolo_det_tiny_shapes_det_128', '--data', 'zoo.datasets.ShapesSegDataModule',
               *QUIET, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = error_line(proc)
    assert 'the detection system needs a detection DataModule; ShapesSegDataModule is a segmentation one' in line
    assert 'zoo.datasets.ShapesDetDataModule' in line  # what to pass instead
    assert tree(tmp_path) == set()


def test_every_task_pair_of_system_and_data_is_checked():
    """Every system of the package against one DataModule of every task: refused exactly when the tasks differ
    (the check ``zoo fit`` makes once both are built), naming both tasks and a DataModule of the right one."""
    import zoo.datasets as D
    import zoo.recipes as R
    from zoo.tasks import names
    from zoo.recipes.system import ZooSystem, require_data_task

    data = [D.ShapesDataModule(), D.ShapesDetDataModule(), D.ShapesSegDataModule(), D.PhotoPatchesDataModule(),
            D.SyntheticLMDataModule()]
    systems = [s for s in (getattr(R, n) for n in R.__all__)
               if isinstance(s, type) and issubclass(s, ZooSystem) and s.task]
    assert sorted({dm.zoo_task for dm in data}) == sorted({s.task for s in systems}) == sorted(names())
    for system in systems:
        for dm in data:
            if dm.zoo_task == system.task:
                require_data_task(system, dm)
                continue
            with pytest.raises(ValueError) as e:
                require_data_task(system, dm)
            message = str(e.value)
            assert f'the {system.task} system needs a {system.task} DataModule' in message, message
            assert f'{type(dm).__name__} is a {dm.zoo_task} one' in message, message
            assert 'zoo.datasets.' in message and '\n' not in message, message


# ---------------------------------------------------- defect 8 (CLI): bad input after the run folder exists
def _earlier_run(tmp_path):
    """A finished run of the recipe with ``latest`` pointing at it, as a user's earlier fit leaves them."""
    run = tmp_path / 'runs' / STEM / '20260101-000000'
    (run / 'checkpoints').mkdir(parents=True)
    (run / 'checkpoints' / 'last.ckpt').write_bytes(b'weights')
    (run / 'run.json').write_text(json.dumps({'command': 'fit', 'status': 'finished'}))
    (tmp_path / 'runs' / STEM / 'latest').symlink_to(run.name, target_is_directory=True)
    return run


@pytest.mark.parametrize('args, expected, earlier', [
    # torch.optim refuses it in configure_optimizers, inside trainer.fit: the run folder and its config exist
    (['--model.optimizer.init_args.lr', '-1'], 'Invalid learning rate: -1.0', True),
    # bad data found as training starts: the config, the loggers' files and the results row are written too;
    # in a fresh folder, so the run root and the recipe's folder this run made go as well
    (['--trainer.callbacks+=interrupt_callback.FailAtStart'], 'bad data in the first batch', False),
])
def test_bad_input_found_after_the_run_started_leaves_nothing(tmp_path, args, expected, earlier):
    run = _earlier_run(tmp_path) if earlier else None
    before = tree(tmp_path)
    proc = zoo('fit', '-c', RECIPE, '--trainer.max_epochs=1', *QUIET, *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert expected in error_line(proc)
    after = {p for p in tree(tmp_path) if not p.startswith('zoo-results.db')}
    assert after == before, after ^ before  # no run folder (nor empty folders it made); an earlier run untouched
    if run is not None:
        assert (tmp_path / 'runs' / STEM / 'latest').resolve() == run.resolve()
    assert db_runs(tmp_path / 'zoo-results.db') == 0


def test_a_run_that_trained_keeps_its_failed_folder_and_row(tmp_path):
    """The other side of the rule: bad data met after a training step is a failed run, kept with its error (in this
    process: what the run left is checked; the refusals above run the command line)."""
    proc = zoo_in_process('fit', '-c', RECIPE, '--trainer.max_epochs=1', '--trainer.limit_train_batches=3', *QUIET,
                          '--trainer.callbacks+=interrupt_callback.FailAt', '--trainer.callbacks.init_args.step=1',
                          cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    [run] = [p for p in (tmp_path / 'runs' / STEM).iterdir()]
    assert json.loads((run / 'run.json').read_text())['status'] == 'failed'
    assert db_runs(tmp_path / 'zoo-results.db') == 1


# ------------------------------------------------------------------------------------------------- rough edges
@pytest.mark.parametrize('args', [['list', '--recipes'], ['info', 'poolformer_s12']])
def test_output_into_a_closed_pipe_ends_quietly(tmp_path, args):
    """``zoo list --recipes | head``: the reader has gone before zoo writes (deterministic: its end is closed
    first). Every command's plain output ends the same way (``zoo list``'s table is rich's, which already did)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = zoo(*args, cwd=tmp_path, stdout=write)
    finally:
        os.close(write)
    assert proc.stderr == '' and proc.returncode == 1, proc.stderr[-3000:]


@pytest.mark.parametrize('args', [
    ['test', '-c', RECIPE, '--runtime', 'onnx'],
    ['bench', 'resnet_tiny', '--runtime', 'eager,onnx'],
    ['profile', 'resnet_tiny', '--runtime', 'onnx'],
    ['results', '--runtime', 'onnx'],
])
def test_an_unknown_runtime_names_the_close_one(tmp_path, args):
    proc = zoo(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = error_line(proc)
    assert "'onnx'" in line and 'did you mean onnxruntime' in line, line  # (or onnxruntime-int8)
    assert tree(tmp_path) == set()


def test_the_fit_summary_counts_the_network_once(tmp_path):
    """With an EMA of the weights the system holds the network twice; the summary's total is the network's (the
    ``model`` row), and the EMA copy is said apart."""
    proc = zoo('fit', '-c', RECIPE, '--model.ema_decay', '0.99', '--trainer.fast_dev_run', 'true',
               '--trainer.enable_progress_bar=false', '--db', 'none', cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [model_row] = [ln for ln in proc.stdout.splitlines() if re.match(r'\s*0\s+model\s', ln)]
    network = re.search(r'(\d[\d.]* [KMB]?)\s+train', model_row).group(1).strip()
    [total] = [ln for ln in proc.stdout.splitlines() if ln.startswith('params: ')]
    assert total.startswith(f'params: {network} (0 frozen)') and f'EMA copy: {network}' in total, proc.stdout
