"""Weighted vs standard convolution in DnCNN: same seeds, same data, same budget; PSNR/SSIM on held-out photos.

For every seed, trains ``--model`` once with ``conv_layer='standard'`` and once with ``conv_layer='weighted'``
(one shared ``--den``) on :class:`zoo.datasets.PhotoPatchesDataModule`, then tests both on the held-out
photographs at ``--sigma``. Prints a table (mean and 95% t-interval over seeds, and the per-seed
difference) and, with ``--out``, writes it as Markdown (an existing file is never overwritten).

    python -m experiments.denoising_compare --seeds 0 1 2 --steps 300 --out docs/measurements/dncnn_compare.md
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch


def run_one(model: str, conv_layer: str, den, seed: int, steps: int, batch_size: int, sigma: float, lr: float,
            patch_size: int, max_side: int) -> dict:
    from lightning.pytorch import Trainer, seed_everything

    from zoo.datasets import PhotoPatchesDataModule
    from zoo.recipes.denoising import Denoiser

    seed_everything(seed, verbose=False)
    args = {'conv_layer': conv_layer, **({'den': list(den)} if conv_layer == 'weighted' else {})}
    system = Denoiser(model, model_args=args, sigma=sigma, optimizer=lambda p: torch.optim.Adam(p, lr=lr))
    data = PhotoPatchesDataModule(patch_size=patch_size, batch_size=batch_size, patches_per_epoch=steps * batch_size,
                                  max_side=max_side, seed=seed)
    trainer = Trainer(max_epochs=1, accelerator='cpu', devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0)
    t = time.perf_counter()
    trainer.fit(system, datamodule=data)
    train_s = time.perf_counter() - t
    out = trainer.test(system, datamodule=data, verbose=False)[0]
    return {'psnr': out['test/psnr'], 'ssim': out['test/ssim'], 'train_s': train_s}


def interval(xs: list[float]) -> tuple[float, float]:
    """Mean and the half-width of the 95% Student-t interval."""
    from zoo.eval.results import t_interval
    return t_interval(xs)


def main(argv=None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--model', default='dncnn')
    ap.add_argument('--den', type=float, nargs='+', default=[0.7])
    ap.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    ap.add_argument('--steps', type=int, default=300, help='training steps per run (one epoch of steps x batch patches)')
    ap.add_argument('--batch-size', type=int, default=32)
    ap.add_argument('--patch-size', type=int, default=40)
    ap.add_argument('--max-side', type=int, default=128)
    ap.add_argument('--sigma', type=float, default=25.0)
    ap.add_argument('--lr', type=float, default=1e-3)
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--out', type=Path, default=None, help='write the Markdown table here (must not exist)')
    args = ap.parse_args(argv)
    if args.out is not None and args.out.exists():
        ap.error(f'{args.out} exists; choose another --out (results are never overwritten)')
    torch.set_num_threads(args.threads)
    res: dict[str, list[dict]] = {'standard': [], 'weighted': []}
    for seed in args.seeds:
        for conv in res:
            r = run_one(args.model, conv, args.den, seed, args.steps, args.batch_size, args.sigma, args.lr,
                        args.patch_size, args.max_side)
            res[conv].append(r)
            print(f"seed {seed} {conv:8s} PSNR {r['psnr']:.3f} dB  SSIM {r['ssim']:.4f}  ({r['train_s']:.0f} s)",
                  flush=True)
    lines = [f'{args.model} on held-out skimage photographs (camera, coins, moon; longer side {args.max_side}), '
             f'sigma {args.sigma:g}, {args.steps} steps x {args.batch_size} patches of {args.patch_size}x'
             f'{args.patch_size}, Adam lr {args.lr:g} cosine, seeds {args.seeds}, den {args.den}', '',
             '| conv | PSNR (dB), mean ± 95% CI | SSIM, mean ± 95% CI | per-seed PSNR |', '|---|---|---|---|']
    for conv, rs in res.items():
        p, s = interval([r['psnr'] for r in rs]), interval([r['ssim'] for r in rs])
        lines.append(f'| {conv} | {p[0]:.2f} ± {p[1]:.2f} | {s[0]:.4f} ± {s[1]:.4f} | '
                     + ', '.join(f"{r['psnr']:.2f}" for r in rs) + ' |')
    d = interval([w['psnr'] - s['psnr'] for w, s in zip(res['weighted'], res['standard'])])
    lines += ['', f'weighted − standard PSNR, paired over seeds: {d[0]:+.2f} ± {d[1]:.2f} dB']
    print('\n'.join(lines))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, 'x') as f:
            f.write('\n'.join(lines) + '\n')
    return lines


if __name__ == '__main__':
    sys.exit(main() and 0)
