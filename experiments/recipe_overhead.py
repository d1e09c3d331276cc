"""Per-step overhead of a zoo recipe (Lightning ``ImageClassifier`` + Trainer with the default callbacks,
CSV logger, gradient clipping, per-step LR schedule) against a plain PyTorch loop doing the same work:
same model, initial weights, data loader, batch, loss, optimizer, clipping and schedule.

(Run it as a module: eval/profile.py would shadow the standard library when run as a script.)
Rounds alternate plain / recipe in one process; each round times the interval between the starts of
consecutive training steps (so everything the loop does between steps counts), and we report medians.

    python -m experiments.recipe_overhead                      # poolformer_tiny on digits, batch 64
    python -m experiments.recipe_overhead --model poolformer_s12 --batch-size 32 --steps 12
"""
from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F


def _plain_steps(system, dm, steps: int, clip: float) -> list[float]:
    """The hand-written loop: returns the start time of every step."""
    model = system.model.train()
    hp = system.hparams
    from zoo.recipes import optim
    opt = torch.optim.AdamW(optim.param_groups(model, 0.05), lr=1e-3)  # the optimizer main() gives the recipe
    sched = optim.scheduler(opt, steps)
    starts, step = [], 0
    while step < steps:
        for x, y in dm.train_dataloader():
            starts.append(time.perf_counter())
            loss = F.cross_entropy(model(x), y, label_smoothing=hp.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            sched.step()
            step += 1
            if step == steps:
                break
    starts.append(time.perf_counter())
    return starts


def _recipe_steps(system, dm, steps: int, clip: float, log_every: int) -> list[float]:
    """The recipe: Trainer + default callbacks + CSV logger, timed by a callback at each step start."""
    from lightning.pytorch import Callback, Trainer
    from lightning.pytorch.loggers import CSVLogger

    from zoo.recipes.cli import default_callbacks

    class Clock(Callback):
        def __init__(self):
            self.starts = []

        def on_train_batch_start(self, *args):
            self.starts.append(time.perf_counter())

        def on_train_end(self, *args):
            self.starts.append(time.perf_counter())

    clock = Clock()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter('ignore')
        trainer = Trainer(accelerator='cpu', devices=1, max_steps=steps, limit_val_batches=0, gradient_clip_val=clip,
                          log_every_n_steps=log_every, logger=CSVLogger(tmp, name='', version=''),
                          callbacks=[*default_callbacks(tmp, 'val/acc1', 'max'), clock], enable_model_summary=False,
                          enable_progress_bar=True, num_sanity_val_steps=0)
        trainer.fit(system, datamodule=dm)
    return clock.starts


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--model', default='poolformer_tiny')
    p.add_argument('--batch-size', type=int, default=64)
    p.add_argument('--img-size', type=int, default=32)
    p.add_argument('--steps', type=int, default=40, help='training steps per round')
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--log-every', type=int, default=10)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from zoo.datasets import DigitsDataModule
    from zoo.recipes import ImageClassifier

    dm = DigitsDataModule(batch_size=args.batch_size, img_size=args.img_size)
    dm.setup('fit')
    torch.manual_seed(0)
    base = ImageClassifier(args.model, num_classes=10, in_chans=1, label_smoothing=0.1,
                           optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.05))
    plain, recipe = [], []
    for r in range(args.rounds):
        for kind in (('plain', 'recipe') if r % 2 == 0 else ('recipe', 'plain')):  # alternate who goes first
            system = copy.deepcopy(base)
            if kind == 'plain':
                s = _plain_steps(system, dm, args.steps, clip=1.0)
            else:
                s = _recipe_steps(system, dm, args.steps, clip=1.0, log_every=args.log_every)
            # Drop the first 2 intervals of each round (warm-up: allocator, first iterator).
            (plain if kind == 'plain' else recipe).extend(b - a for a, b in zip(s[2:], s[3:]))
    mp, mr = statistics.median(plain) * 1e3, statistics.median(recipe) * 1e3
    print(f'{args.model}, batch {args.batch_size}, {args.img_size}x{args.img_size}, {args.threads} thread(s), '
          f'{args.rounds} rounds x {args.steps} steps, interleaved')
    print(f'  plain PyTorch loop : {mp:8.2f} ms/step (median of {len(plain)})')
    print(f'  zoo recipe         : {mr:8.2f} ms/step (median of {len(recipe)})')
    print(f'  overhead           : {(mr / mp - 1) * 100:+.1f} % (ratio {mr / mp:.3f})')


if __name__ == '__main__':
    main()
