"""Every GPU path of zoo in one short run, for the first machine with a CUDA GPU (issue 45, item 6).

Exercised, each reported as ok / failed with its one-line reason (nothing here has run on a GPU before):

1. ``zoo bench --device cuda``: eager and ``torch.compile`` at float32, float16 and bfloat16 (autocast), timed with
   CUDA events, with the peak memory of one call and the GPU's name, driver and clocks in each row, written to a
   results database and read back by ``zoo results --device cuda``;
2. a resolution sweep on the GPU (``--img-size 64 128 224``, the fitted exponent);
3. a tiny fit step of the demo recipe with ``--trainer.accelerator gpu``;
4. a dynamic-size ONNX export run by ONNX Runtime's CUDA execution provider, when onnxruntime-gpu is installed.

On a machine without CUDA it says that it needs a GPU and exits 0 (the smoke run of tests/test_studies.py);
``--require-gpu`` makes that exit 1. Well under 10 minutes on any GPU (tiny models, small images, a few batches).

    python -m benchmarks.gpu_check                      # on the GPU machine
    python -m benchmarks.gpu_check --out /tmp/gpu_check # keep the database and the exported file there
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

DEMO = 'recipes/configs/poolformer/poolformer_tiny_digits_15e.yaml'


def _step(results: list, what: str, fn) -> None:
    t0 = time.perf_counter()
    try:
        detail = fn()
        results.append((what, 'ok', detail or ''))
    except Exception as e:  # each path is reported; one failing does not hide the others
        line = (str(e).strip().splitlines() or [''])[0][:200]
        results.append((what, 'FAILED', f'{type(e).__name__}: {line}'))
        traceback.print_exc(file=sys.stderr)
    print(f'{what}: {results[-1][1]} ({time.perf_counter() - t0:.1f} s) {results[-1][2]}', flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', help='folder for the results database and exported file (default: a temporary one)')
    p.add_argument('--require-gpu', action='store_true', help='exit 1 (not 0) when there is no CUDA GPU')
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(f'gpu_check needs a CUDA GPU; PyTorch sees none here (torch {torch.__version__}, built with CUDA '
              f'{torch.version.cuda}). Nothing was run.')
        return 1 if args.require_gpu else 0
    from zoo._timing import gpu
    from zoo.recipes.main import main as zoo

    out = Path(args.out or tempfile.mkdtemp(prefix='zoo-gpu-check-'))
    out.mkdir(parents=True, exist_ok=True)
    db = str(out / 'gpu.db')
    card = gpu('cuda')
    print(f"GPU: {card['gpu_name']}, driver {card['gpu_driver']}, clocks {card['gpu_clocks']}; torch "
          f'{torch.__version__}, CUDA {torch.version.cuda}; results in {out}')
    results: list = []

    def zoo_ok(*argv):
        rc = zoo(list(argv))
        if rc != 0:
            raise RuntimeError(f'zoo {" ".join(argv)} exited {rc}')

    for dtype in ('float32', 'float16', 'bfloat16'):
        _step(results, f'bench eager+compile {dtype}', lambda d=dtype: zoo_ok(
            'bench', 'resnet_tiny', 'poolformer_tiny', '--device', 'cuda', '--runtime', 'eager,compile', '--dtype', d,
            '--batch-size', '1', '32', '--img-size', '64', '--repeats', '10', '--time', '1', '--db', db))

    def stored():
        from zoo.eval import results as R
        lat = R.open_db(db).latency()
        gpu_rows = lat[lat.device == 'cuda']
        if gpu_rows.empty or gpu_rows.peak_mem_mb.isna().any() or gpu_rows.gpu_name.isna().any():
            raise RuntimeError('the GPU rows lack their peak memory or GPU name')
        return (f'{len(gpu_rows)} rows; peak memory {gpu_rows.peak_mem_mb.min():.0f}-{gpu_rows.peak_mem_mb.max():.0f} '
                f'MiB; driver {gpu_rows.gpu_driver.iloc[0]}')
    _step(results, 'stored rows (peak memory, GPU name)', stored)
    _step(results, 'resolution sweep 64 128 224', lambda: zoo_ok(
        'bench', 'resnet_tiny', 'metaformer_tiny', '--device', 'cuda', '--img-size', '64', '128', '224',
        '--repeats', '10', '--time', '1'))
    _step(results, 'fit step --trainer.accelerator gpu', lambda: zoo_ok(
        'fit', '-c', DEMO, '--trainer.accelerator', 'gpu', '--trainer.devices', '1', '--trainer.fast_dev_run', 'true',
        '--db', 'none'))

    def onnx_cuda():
        import importlib.util
        if importlib.util.find_spec('onnxruntime') is None:
            return 'skipped: onnxruntime is not installed'
        import onnxruntime as ort

        import zoo as z
        if 'CUDAExecutionProvider' not in ort.get_available_providers():
            return f'skipped: this onnxruntime has no CUDA provider ({", ".join(ort.get_available_providers())})'
        model = z.create('resnet_tiny').eval()
        path = z.export(model, out / 'resnet_tiny.onnx', torch.randn(2, 3, 64, 64), dynamic_size=True)
        sess = ort.InferenceSession(str(path), providers=['CUDAExecutionProvider'])
        x = torch.randn(4, 3, 96, 128)
        got = torch.from_numpy(sess.run(None, {'input': x.numpy()})[0])
        with torch.no_grad():
            diff = (got - model(x)).abs().max().item()
        return f'{sess.get_providers()[0]}, max |delta| from eager {diff:.1e} at 96x128'
    _step(results, 'export + onnxruntime CUDA EP', onnx_cuda)
    _step(results, 'zoo results --device cuda', lambda: zoo_ok('results', '--db', db, '--device', 'cuda', '--runs'))
    failed = [r for r in results if r[1] != 'ok']
    print(f'\n{len(results) - len(failed)} of {len(results)} GPU paths ok' + (
        ': failed ' + '; '.join(r[0] for r in failed) if failed else ''))
    return 1 if failed else 0


if __name__ == '__main__':
    raise SystemExit(main())
