"""The studies (benchmarks/ and experiments/ at the checkout root, not installed) run as their READMEs say:
``python -m <folder>.<name>`` from the root, each here once with its smallest arguments in a subprocess. Exit
code 0 and the lines each one must print are checked; no figure is (they are toy sizes on a shared machine)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ('benchmarks', 'experiments')

# module -> runs, each (arguments, text the output must contain); '{tmp}' is the test's temporary folder
SMOKE = {
    'benchmarks.bench_mlp': [(['--models', 'raftmlp_tiny', 'stripmlp_tiny', '--batch-sizes', '1', '--repeats', '1',
                               '--warmup', '0', '--img-size', '32', '--threads', '1', '--markdown'],
                              ['| model | params (M) |', '| raftmlp_tiny |', '| stripmlp_tiny |'])],
    'benchmarks.bench_results': [(['--runs', '3', '--epochs', '2', '--models', '2', '--tasks', '1',
                                   '--db', '{tmp}/bench.db'],
                                  ['recording one run (2 epochs', 'leaderboard() over 3 runs',
                                   'aggregate: 2 models x 1 tasks'])],
    'benchmarks.canon_bench': [(['--smoke'], ['gla: T=64', 'ssd: T=64', 'mamba2+ABCD', 'load average'])],
    'benchmarks.convbn_bench': [(['--batch', '2', '--size', '32', '--repeats', '1', '--modes', 'tune'],
                                 ['fine-tuning step, batch 2, 32x32', '\neval ', '\ntune ', 'peak MiB'])],
    'benchmarks.detection_bench': [(['eval', '--repeats', '1'], ['| faster_coco_eval |', '| pycocotools |'])],
    'benchmarks.family_table': [(['--models', 'poolformer_tiny', 'vgg_tiny:2', '--runtimes', 'eager', 'onnxruntime',
                                  'bf16-eager', 'onednn-off', '--batch-sizes', '2', '--repeats', '1', '--warmup', '0',
                                  '--threads', '1', '--out', '{tmp}/table.jsonl'],
                                 ['CPU: ', 'fp32 peak (estimate): 1 cores x', 'fp32 GEMM (measured', 'uptime before: ',
                                  '| poolformer | poolformer_tiny | 3x32x32 | 2 | 0.00 |', '| vgg | vgg_tiny | ',
                                  'x) |', '| onnxruntime |']),
                                (['--table', '{tmp}/table.jsonl', '--threads', '1'],
                                 ['| poolformer_tiny | 2 | onnxruntime |', '| vgg | vgg_tiny | '])],
    'benchmarks.official_mlp': [(['--models', 'raftmlp_tiny', 'stripmlp_tiny', '--raftmlp',
                                  'tests/reference_raftmlp.py', '--stripmlp', 'tests/reference_stripmlp.py',
                                  '--runtimes', 'eager', '--batch-sizes', '2', '--repeats', '1', '--warmup', '0',
                                  '--threads', '1'],
                                 ['CPU: ', '$ zoo bench raftmlp_tiny --vs official:', '| raftmlp_tiny | 2 | eager |',
                                  '| stripmlp_tiny | 2 | best: zoo eager, official eager |', 'target >= 1.3'])],
    'benchmarks.piip_bench': [(['deform', '--repeats', '1', '--threads', '1'], ['T<-S', 'S<-T', 'B<-S', 'per-head'])],
    'benchmarks.resolution': [(['--base', 'metaformer_tiny', '--mixers', 'pooling', 'attention', '--sizes', '32', '64',
                                 '--match-size', '32', '--repeats', '1', '--warmup', '0', '--time', '0', '--threads',
                                 '1', '--markdown'],
                                ['| mixer | dims | size |', '| pooling |', '| attention |', 'exponent k'])],
    'benchmarks.gpu_check': [([], ['gpu_check needs a CUDA GPU'] if not __import__('torch').cuda.is_available()
                              else ['GPU paths ok'])],
    'benchmarks.runtimes': [(['--pairs', 'vgg_tiny:resnet10t', '--runtimes', 'eager', 'onnxruntime', '--batch-sizes',
                              '2', '--img-size', '32', '--repeats', '1', '--warmup', '0', '--threads', '1',
                              '--settle', '0'],
                             ['CPU: ', '| vgg_tiny / resnet10t | 2 | onnxruntime |', 'ratio'])],
    'benchmarks.scan_bench': [(['--threads', '1', 'scan', '--size', '32', '--chunks', '4', '8', '--repeats', '1',
                                '--modes', 'inference'],
                               ['case=sequential', 'case=chunked/4', 'case=chunked/8', 'case=chunked_autograd'])],
    'benchmarks.scan_onnx': [(['--smoke', '--only', 'parallel/16', 'loop/auto'],
                              ['| L | K*D | eager chunked | parallel/16 | loop/auto |', '| 40 | 16 |', '| 7 | 32 |'])],
    # no trained runs under {tmp}: the script finds the group's jobs and says which checkpoints are missing
    'benchmarks.int8_accuracy': [(['--groups', 'backbones_shapes64', '--run-root', '{tmp}', '--db', '{tmp}/i.db'],
                                  ['backbones_shapes64/poolformer seed 0: no checkpoint', '| group | entry |'])],
    'benchmarks.auto_check': [(['--models', 'resnet_tiny', '--batch-sizes', '2', '--img-size', '32', '--repeats', '1'],
                               ['CPU: ', '| resnet_tiny | 2 |', 'within 3 % of the best:'])],
    'benchmarks.int8_blocks': [(['--model', 'resnet_tiny', '--img-size', '32', '--batch-size', '2', '--repeats', '1'],
                                ['CPU: ', '| resnet_tiny | conv | 11 |'])],
    'benchmarks.train_step': [(['--model', 'semfpn_seg_tiny', '--num-classes', '3', '--batch-size', '2', '--img-size',
                                 '32', '--modes', 'fp32', 'bf16-cl', '--repeats', '1', '--warmup', '0', '--threads', '1'],
                                ['CPU: ', '| fp32 |', '| bf16-cl |'])],
    'benchmarks.weighted_bench': [(['--repeats', '1', '--settings', '32:cifar:2'],
                                   ['ResNet-18 cifar stem 32x32 batch 2', 'ratio'])],
    'experiments.canon_probe': [(['copy', '--N', '4', '--steps', '4', '--batch', '2', '--warmup', '1', '--eval-every',
                                  '2', '--eval-windows', '4', '--seeds', '0', '--variants', '1L RoPE', '--out',
                                  '{tmp}/probe.jsonl'], ['copy N=4 1L RoPE seed=0']),
                                (['--table', '{tmp}/probe.jsonl'], ['| task | N |', '| copy | 4 |'])],
    'experiments.denoising_compare': [(['--seeds', '0', '1', '--steps', '2', '--batch-size', '2', '--patch-size', '8',
                                        '--max-side', '32', '--out', '{tmp}/dncnn.md'],
                                       ['| standard |', '| weighted |', 'paired over seeds'])],
    'experiments.notebook_data': [(['--conv-only', '--out', '{tmp}/data'], ['[export] conv:'])],
    'experiments.recipe_overhead': [(['--steps', '4', '--rounds', '2', '--batch-size', '8', '--img-size', '16'],
                                     ['plain PyTorch loop', 'zoo recipe', 'overhead'])],
}


def test_every_study_has_a_smoke_run_and_a_readme_line():
    on_disk = {f'{folder}.{p.stem}' for folder in FOLDERS for p in (ROOT / folder).glob('*.py')
               if p.stem != '__init__'}
    assert on_disk == set(SMOKE), \
        f'add a smoke run for {sorted(on_disk - set(SMOKE))}, drop {sorted(set(SMOKE) - on_disk)}'
    for folder in FOLDERS:
        readme = (ROOT / folder / 'README.md').read_text()
        missing = [m for m in on_disk if m.startswith(folder + '.') and f"`{m.split('.')[1]}.py`" not in readme]
        assert not missing, f'{folder}/README.md does not list {missing}'


@pytest.mark.parametrize('module', sorted(SMOKE))
def test_study_runs_from_the_checkout(module, tmp_path):
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    for args, expected in SMOKE[module]:
        args = [a.replace('{tmp}', str(tmp_path)) for a in args]
        proc = subprocess.run([sys.executable, '-m', module, *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, f'python -m {module} {" ".join(args)}:\n{proc.stderr[-3000:]}'
        missing = [text for text in expected if text not in proc.stdout]
        assert not missing, f'python -m {module} {" ".join(args)} did not print {missing}:\n{proc.stdout[-3000:]}'
