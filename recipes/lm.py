"""Causal language modelling on the synthetic reasoning tasks (Physics of Language Models: Part 4.1,
arXiv 2512.17351): AdamW (betas 0.9 / 0.98, eps 1e-6), linear warm-up then cosine decay to 10 %, loss only
on answer tokens, exact-answer accuracy at the hardest size.

``zoo fit -c recipes/configs/lm/llama_tiny_copy.yaml`` with ``zoo.datasets.SyntheticLMDataModule``. The system
builds its network with ``zoo.create(name, vocab_size=..., **model_args)``; ``zoo fit`` links the vocabulary
from the data module. It never defines architecture.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

import zoo

from . import optim
from .system import ZooSystem

__all__ = ['CausalLM', 'answer_accuracy']


def answer_accuracy(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per answer (an answer id within a window): whether every one of its tokens is predicted (argmax,
    teacher forcing — equivalent to greedy decoding of that answer), and its tag.

    Returns (correct (A,) bool, tag (A,), token_correct (n,) bool over all loss tokens).
    """
    ans, target = batch['answer'], batch['target']
    sel = ans >= 0
    tok_ok = logits.argmax(-1)[sel] == target[sel]
    width = int(ans.max().clamp(min=0)) + 1
    key = (torch.arange(ans.shape[0], device=ans.device)[:, None] * width + ans)[sel]   # unique per (window, answer)
    uniq, inv = key.unique(return_inverse=True)
    ok = torch.ones(len(uniq), dtype=torch.long, device=ans.device).scatter_reduce(0, inv, tok_ok.long(), 'amin')
    tag = torch.zeros(len(uniq), dtype=torch.long, device=ans.device).scatter_reduce(0, inv, batch['tag'][sel], 'amax')
    return ok.bool(), tag, tok_ok


class CausalLM(ZooSystem):
    """Next-token training of a ``language_modeling`` model on answer tokens.

    Args:
        name: registered model (``llama_tiny``, ``gla_8l512d``, ...). model_args: ``zoo.create`` overrides
            (``canon: ABCD``, ``rope_dim: 0``, ``depth: 2``, ...). vocab_size: linked from the data module.
        generate_samples: Brevo only: instances generated per validation for the exact-answer metric.
        Everything else: :class:`ZooSystem` (the paper's optimizer: AdamW, betas 0.9 / 0.98, eps 1e-6, weight
        decay 0.03 on matrices and Canon kernels; warm-up 1000 steps, cosine to 10 %).
    """

    task = 'language_modeling'

    def __init__(self, name: str = 'llama_tiny', generate_samples: int = 32,
                 optimizer: OptimizerCallable = lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.03,
                                                                                 betas=(0.9, 0.98), eps=1e-6),
                 lr_scheduler: Optional[LRSchedulerCallable] = lambda opt: optim.WarmupCosine(
                     opt, warmup_steps=1000, min_lr_ratio=0.1), **kwargs):
        super().__init__(name, optimizer=optimizer, lr_scheduler=lr_scheduler, **kwargs)
        args = self.model_args
        pos = {None: 'rope', 0: 'nope'}.get(args.get('rope_dim'), 'partial_rope')
        if args.get('rope_heads', 1) != 1 and pos != 'nope':
            pos = f"rope_heads{args['rope_heads']}_{pos}"       # e.g. rope_heads0.5_partial_rope
        self.block_choices = {'canon': args.get('canon', ''),
                              'pos': pos if zoo.model_info(name).family == 'llama' else zoo.model_info(name).family}
        self._acc = {}

    def _loss(self, logits, batch):
        sel = batch['answer'] >= 0
        return F.cross_entropy(logits[sel].float(), batch['target'][sel])

    def training_step(self, batch, batch_idx):
        loss = self._loss(self(batch['input']), batch)
        self.log_train(loss)
        return loss

    def _eval_step(self, batch, split: str):
        logits = self.eval_model(batch['input'])  # the EMA, or the network in zoo test --runtime's runtime
        self.log(f'{split}/loss', self._loss(logits, batch), prog_bar=True, sync_dist=True)
        ok, tag, tok_ok = answer_accuracy(logits, batch)
        acc = self._acc.setdefault(split, {'tok': [0, 0]})
        acc['tok'][0] += int(tok_ok.sum()); acc['tok'][1] += tok_ok.numel()  # noqa: E702
        for t in tag.unique().tolist():
            c = acc.setdefault(t, [0, 0])
            c[0] += int(ok[tag == t].sum()); c[1] += int((tag == t).sum())  # noqa: E702

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, 'val')

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, 'test')

    def _eval_end(self, split: str):
        acc = self._counts(self._acc.pop(split, None) or {})
        if not acc:
            return
        tok = acc.pop('tok')
        self.log(f'{split}/token_acc', tok[0] / max(1, tok[1]))
        dm = getattr(self.trainer, 'datamodule', None)
        main = getattr(dm, 'acc_tag', None)
        for t, (c, n) in acc.items():
            if main is not None and t not in (main, 0):  # tag 0: untagged answers (Mano's expression)
                self.log(f'{split}/acc_tag{t}', c / n)
        if main is not None and main in acc:
            self.log(f'{split}/acc', acc[main][0] / acc[main][1], prog_bar=True)
        elif main is None:
            self.log(f'{split}/acc', sum(c for c, _ in acc.values()) / sum(n for _, n in acc.values()), prog_bar=True)
        # Brevo: generate the whole answer, token by token with the eager model's cache (a runtime's graph is the
        # whole-window forward, so zoo test --runtime reports the teacher-forced metrics only)
        if getattr(getattr(dm, 'task', None), 'eos', None) is not None and self._runtime_model is None:
            overall, by_depth = self.generated_accuracy(dm)
            self.log(f'{split}/acc_generated', overall, prog_bar=True)
            for d, a in by_depth.items():
                self.log(f'{split}/acc_depth{d}', a)

    def _counts(self, acc: dict) -> dict:
        """The (correct, total) counts of every process added up: under DDP each one saw its share of the split."""
        if self.trainer.world_size == 1:
            return acc
        import torch.distributed as dist
        parts = [None] * self.trainer.world_size
        dist.all_gather_object(parts, acc)
        total = {}
        for part in parts:
            for k, (c, n) in part.items():
                t = total.setdefault(k, [0, 0])
                t[0] += c; t[1] += n  # noqa: E702
        return total

    @torch.no_grad()
    def generated_accuracy(self, dm) -> tuple[float, dict[int, float]]:
        """Brevo's metric: greedy (cached) generation after ``<ans>`` must be exactly the ancestor set in a valid
        order. Returns the accuracy and the accuracy per depth of the query's ancestor sub-DAG (the paper's
        stratification; ``Instance.meta['depth']``)."""
        from zoo.datasets.synthetic import brevo_check
        task, hits = dm.task, {}
        insts = dm.generative_eval_instances(self.hparams.generate_samples)
        for inst in insts:
            cut = inst.tokens.index(task.ans) + 1
            prompt = torch.tensor([inst.tokens[:cut]], device=self.device)
            out = self.model.generate(prompt, len(inst.tokens) - cut + 2)[0, cut:].tolist()
            hits.setdefault(inst.meta['depth'], []).append(brevo_check(inst, out, task.eos))
        overall = sum(sum(h) for h in hits.values()) / len(insts)
        return overall, {d: sum(h) / len(h) for d, h in sorted(hits.items())}

    def on_validation_epoch_end(self):
        self._eval_end('val')

    def on_test_epoch_end(self):
        self._eval_end('test')
