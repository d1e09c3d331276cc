"""Synthetic reasoning tasks: each generator checked by an independent solver that reads only the token
stream, the difficulty law, packing and answer masks, and the recipe end to end (issue 7)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from zoo.datasets.synthetic import (Brevo, Depo, Mano, TokenCopy, brevo_check, brevo_depth, difficulty_probs,
                                    make_task, pack_window, sample_difficulty)


def split_names(toks, vocab):
    """Cut a token run into names by the last-token rule (a name ends with a token in [V+1, 2V])."""
    names, cur = [], []
    for t in toks:
        cur.append(t)
        if vocab < t <= 2 * vocab:
            names.append(tuple(cur))
            cur = []
    assert not cur, 'a name must end with a last-token'
    return names


def solve_depo(task: Depo, toks):
    """Independent Depo solver: rebuild the successor map from the edge list, answer each query."""
    assert toks[0] == task.bos
    specials = set(task.query_ids) | {task.ans}
    first_q = next(i for i, t in enumerate(toks) if t in specials)
    names = split_names(toks[1:first_q], task.vocab)
    succ = dict(zip(names[::2], names[1::2]))
    assert len(succ) == len(names) // 2, 'every node has exactly one outgoing edge'
    # one cycle through all nodes
    start, node, seen = names[0], names[0], set()
    while node not in seen:
        seen.add(node)
        node = succ[node]
    assert node == start and seen == set(succ) == set(succ.values())
    queries, i = [], first_q
    while i < len(toks):
        k = task.query_ids.index(toks[i]) + 1
        j = toks.index(task.ans, i)
        q = split_names(toks[i + 1:j], task.vocab)[0]
        end = j + 1
        while not task.vocab < toks[end] <= 2 * task.vocab:
            end += 1
        a = tuple(toks[j + 1:end + 1])
        node = q
        for _ in range(k):
            node = succ[node]
        queries.append((q, k, a, node))
        i = end + 1
    return succ, queries


@pytest.mark.parametrize('kind', ['depo1', 'depo1_mini', 'depo2'])
def test_depo_against_independent_solver(kind):
    task = make_task(kind, N=12 if kind != 'depo1_mini' else 10)
    rng = np.random.default_rng(1)
    for _ in range(30):
        n = sample_difficulty(rng, task.N)
        inst = task.instance(rng, n)
        succ, queries = solve_depo(task, inst.tokens)
        assert len(succ) == n and len(queries) == min(10, n)
        assert len({q for q, *_ in queries}) == len(queries), 'queried nodes are distinct'
        for q, k, a, truth in queries:
            assert 1 <= k <= task.K and a == truth
        lo, hi = task.name_len
        assert all(lo <= len(nm) <= hi for nm in succ)
        # loss only on <ans> and the answer tokens
        marked = [t for t, a in zip(inst.tokens, inst.answer) if a >= 0]
        assert marked == [t for q, k, a, _ in queries for t in (task.ans, *a)]


def test_depo_eval_k_and_name_capacity():
    task = make_task('depo1_mini', N=10, K=4)
    inst = task.instance(np.random.default_rng(0), 10, k=(4, 2))
    assert {k for _, k, _ in inst.meta['queries']} <= {2, 4}
    with pytest.raises(ValueError, match='distinct names'):
        Depo(N=40, vocab=8, name_len=(1, 1))


def solve_brevo(task: Brevo, toks):
    """Independent Brevo solver: parse the edges, BFS the ancestors of the query."""
    q_at, a_at = toks.index(task.query), toks.index(task.ans)
    split = (lambda r: [(t,) for t in r]) if task.single else (lambda r: split_names(r, task.vocab))
    names = split(toks[1:q_at])
    edges = list(zip(names[::2], names[1::2]))
    parents = {}
    for p, c in edges:
        parents.setdefault(c, set()).add(p)
    q = split(toks[q_at + 1:a_at])[0]
    anc, todo = set(), list(parents.get(q, ()))
    while todo:
        x = todo.pop()
        if x not in anc:
            anc.add(x)
            todo += parents.get(x, ())
    return edges, parents, q, anc, split(toks[a_at + 1:toks.index(task.eos)])


@pytest.mark.parametrize('kind', ['brevo1', 'brevo2'])
def test_brevo_against_independent_solver(kind):
    task = make_task(kind, N=20)
    rng = np.random.default_rng(2)
    for _ in range(30):
        n = sample_difficulty(rng, task.N)
        inst = task.instance(rng, n)
        edges, parents, q, anc, answer = solve_brevo(task, inst.tokens)
        outdeg = {}
        for p, _ in edges:
            outdeg[p] = outdeg.get(p, 0) + 1
        assert max(outdeg.values()) <= 4
        assert parents.get(q), 'the query has a parent'
        assert inst.meta['query'] >= min(3 * n // 4, n - 1) or not any(inst.meta['parents'][min(3 * n // 4, n - 1):])
        assert all(p < c for c, ps in enumerate(inst.meta['parents']) for p in ps), 'parents come earlier'
        assert len(answer) == len(set(answer)) and set(answer) == anc
        pos = {x: i for i, x in enumerate(answer)}
        assert all(pos[p] < pos[x] for x in answer for p in parents.get(x, ())), 'topological order'
        marked = [t for t, a in zip(inst.tokens, inst.answer) if a >= 0]
        assert marked == inst.tokens[inst.tokens.index(task.ans):]


def test_brevo_metric_accepts_any_valid_order_only():
    task = make_task('brevo1', N=20)
    rng = np.random.default_rng(3)
    inst = next(i for i in (task.instance(rng, 20) for _ in range(50)) if len(i.meta['ancestors']) >= 3)
    names, parents, order = inst.meta['names'], inst.meta['parents'], inst.meta['order']
    gen = [t for x in order for t in names[x]] + [task.eos]
    assert brevo_check(inst, gen, task.eos)
    alt = sorted(order)                                   # insertion order is another valid topological order
    assert brevo_check(inst, [t for x in alt for t in names[x]] + [task.eos], task.eos)
    assert not brevo_check(inst, gen[1:], task.eos)                    # one missing
    assert not brevo_check(inst, gen[:1] + gen, task.eos)              # a duplicate
    child = next(x for x in order if any(p in order for p in parents[x]))
    bad = [child] + [x for x in order if x != child]                   # a child before its parent
    assert not brevo_check(inst, [t for x in bad for t in names[x]] + [task.eos], task.eos)
    assert not brevo_check(inst, gen[:-1], task.eos)                   # no <eos>


def test_brevo_depth_on_a_hand_made_dag_and_in_every_instance():
    #   0 -> 2 -> 4 -> 5,  0 -> 3 -> 5,  1 -> 3,  1 -> 6;  7 is an isolated root
    parents = [[], [], [0], [0, 1], [2], [3, 4], [1], []]
    assert [brevo_depth(parents, x) for x in range(8)] == [0, 0, 1, 1, 2, 3, 1, 0]
    chain = [[]] + [[i] for i in range(2999)]                              # a 2999-edge chain: no recursion limit
    assert brevo_depth(chain, 2999) == 2999
    # generated instances carry their query's depth; check it by relaxation over the edges in the token stream
    task = make_task('brevo1', N=20)
    rng, seen = np.random.default_rng(5), set()
    for _ in range(40):
        inst = task.instance(rng, 20)
        edges, _, q, anc, _ = solve_brevo(task, inst.tokens)
        longest = {x: 0 for e in edges for x in e}
        for _ in range(len(longest)):
            for p, c in edges:
                longest[c] = max(longest[c], longest[p] + 1)
        assert inst.meta['depth'] == longest[q] >= 1
        seen.add(inst.meta['depth'])
    assert len(seen) >= 3, seen


def test_recipe_reports_brevo_accuracy_by_depth():
    """``generated_accuracy`` groups the exact-answer metric by the query's sub-DAG depth: a model that answers
    only depth-1 queries correctly scores 1 there and 0 elsewhere."""
    from zoo.datasets import SyntheticLMDataModule
    from zoo.recipes.lm import CausalLM
    dm = SyntheticLMDataModule('brevo1', {'N': 12}, context_length=64, train_windows=8, val_windows=8)
    system = CausalLM('llama_tiny', vocab_size=dm.vocab_size, generate_samples=24)
    truth = {tuple(i.tokens[:i.tokens.index(dm.task.ans) + 1]): i for i in dm.generative_eval_instances(24)}

    def oracle_for_depth_1(prompt, max_new_tokens):
        inst = truth[tuple(prompt[0].tolist())]
        rest = inst.tokens[len(prompt[0]):] if inst.meta['depth'] == 1 else [dm.task.eos]
        return torch.cat([prompt, torch.tensor([rest])], 1)

    system.model.generate = oracle_for_depth_1
    overall, by_depth = system.generated_accuracy(dm)
    depths = [i.meta['depth'] for i in truth.values()]
    assert set(by_depth) == set(depths) and len(by_depth) >= 2, by_depth
    assert by_depth[1] == 1.0 and all(a == 0.0 for d, a in by_depth.items() if d != 1)
    assert overall == depths.count(1) / len(depths)


def eval_prefix(tokens, task: Mano):
    """Independent prefix evaluator: scan right to left with a stack."""
    ops = {v: k for k, v in task.op_ids.items()}
    stack = []
    for t in reversed(tokens):
        if t in ops:
            a, b = stack.pop(), stack.pop()
            stack.append({'+': a + b, '-': a - b, '*': a * b}[ops[t]] % 23)
        else:
            stack.append(t - 1)
    assert len(stack) == 1
    return stack[0]


def test_mano_against_independent_evaluator():
    task = Mano(L=6)
    assert eval_prefix([task.op_ids['+'], 4, task.op_ids['*'], 19, task.op_ids['-'], 1, 3], task) == 13  # + 3 (* 18 (- 0 2))
    rng = np.random.default_rng(4)
    counts = set()
    for _ in range(200):
        inst = task.sample(rng)
        toks = inst.tokens
        ell = task.len_ids.index(toks[1]) + 1
        body = toks[2:toks.index(task.ans)]
        assert sum(t in task.op_ids.values() for t in body) == ell and 1 <= ell <= 6
        assert toks[-1] - 1 == eval_prefix(body, task) == inst.meta['value']
        counts.add(ell)
        assert inst.tag[-1] == 1 and inst.answer[-1] >= 0
    assert counts == set(range(1, 7))
    only = Mano(L=3, loss_on='answer').instance(rng, 3)
    assert [a >= 0 for a in only.answer] == [False] * (len(only) - 1) + [True]


def test_copy_probe():
    task = TokenCopy(N=10)
    inst = task.instance(np.random.default_rng(0), 10)
    perm = inst.tokens[1:11]
    assert sorted(perm) == list(range(1, 11)) and inst.tokens[11] == task.query and inst.tokens[12:] == perm
    assert [a >= 0 for a in inst.answer] == [False] * 12 + [True] * 10


def test_difficulty_law():
    ns, p = difficulty_probs(36)
    assert ns[0] == 3 and ns[-1] == 36
    assert np.allclose(p, (1 / (ns + 6)) / (1 / (ns + 6)).sum())
    rng = np.random.default_rng(0)
    draws = np.array([sample_difficulty(rng, 36) for _ in range(20000)])
    freq = np.bincount(draws, minlength=37)[3:] / len(draws)
    assert np.abs(freq - p).max() < 0.01


def test_packing_left_aligned_whole_instances_and_deterministic():
    task = make_task('depo1_mini', N=10)
    a = pack_window(task, np.random.default_rng(5), 200)
    b = pack_window(task, np.random.default_rng(5), 200)
    assert all(np.array_equal(x, y) for x, y in zip(a[:3], b[:3]))
    tokens, answer, _, insts = a
    used = sum(len(i) for i in insts)
    assert tokens[0] == task.bos and (tokens[used:] == 0).all() and (answer[used:] == -1).all()
    assert np.array_equal(tokens[:used], np.concatenate([i.tokens for i in insts]))
    assert len(set(answer[answer >= 0].tolist())) == sum(max(i.answer) + 1 for i in insts)  # ids unique per window
    with pytest.raises(ValueError, match='context'):
        pack_window(TokenCopy(N=50), np.random.default_rng(0), 40)


def test_datamodule_batches_shift_targets_and_mask_answers():
    from zoo.datasets import SyntheticLMDataModule
    dm = SyntheticLMDataModule('depo1_mini', {'N': 8, 'K': 4}, context_length=64, batch_size=4,
                               train_windows=8, val_windows=4)
    batch = next(iter(dm.train_dataloader()))
    assert batch['input'].shape == batch['target'].shape == (4, 64)
    assert torch.equal(batch['input'][:, 1:], batch['target'][:, :-1])
    sel = batch['answer'] >= 0
    ans_tok = dm.task.ans
    assert (batch['target'][sel] == ans_tok).sum() > 0
    assert not ((batch['target'] == ans_tok) & ~sel).any()
    val = next(iter(dm.val_dataloader()))
    assert set(val['tag'][val['answer'] >= 0].tolist()) <= {2, 4} and dm.acc_tag == 4
    again = SyntheticLMDataModule('depo1_mini', {'N': 8, 'K': 4}, context_length=64, train_windows=8)
    assert torch.equal(again.train_set[3]['input'], dm.train_set[3]['input'])


def test_recipe_trains_and_logs(tmp_path, one_thread):
    import lightning as L
    from zoo.datasets import SyntheticLMDataModule
    from zoo.recipes.lm import CausalLM
    L.seed_everything(0)
    dm = SyntheticLMDataModule('copy', {'N': 8}, context_length=18, batch_size=16, train_windows=16 * 25, val_windows=16)
    from zoo.recipes.optim import WarmupCosine
    system = CausalLM('llama_tiny', model_args={'canon': 'AC'}, vocab_size=dm.vocab_size,
                      optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.03, betas=(0.9, 0.98)),
                      lr_scheduler=lambda o: WarmupCosine(o, warmup_steps=5, min_lr_ratio=0.1))
    assert system.block_choices == {'canon': 'AC', 'pos': 'rope'} and system.model_name == 'llama_tiny'
    assert CausalLM('llama_tiny', model_args={'rope_dim': 0}).block_choices['pos'] == 'nope'
    assert CausalLM('llama_tiny', model_args={'rope_heads': 0.5, 'rope_dim': 4}).block_choices['pos'] == \
        'rope_heads0.5_partial_rope'
    trainer = L.Trainer(max_steps=25, num_sanity_val_steps=0, accelerator='cpu', logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.validate(system, dm)
    before = trainer.callback_metrics['val/loss'].item()
    trainer.fit(system, dm)
    after = trainer.callback_metrics
    assert after['val/loss'].item() < before and 0 <= after['val/acc'].item() <= 1
    assert system.hparams.vocab_size == dm.vocab_size


CONFIGS = sorted((__import__('pathlib').Path(__file__).parents[1] / 'recipes' / 'configs' / 'lm').glob('*.yaml'))


@pytest.mark.parametrize('path', CONFIGS, ids=lambda p: p.stem)
def test_lm_configs_name_registered_models_and_tasks(path):
    import yaml

    import zoo
    from zoo.datasets.synthetic import TASKS
    cfg = yaml.safe_load(path.read_text())
    model, data = cfg['model']['init_args'], cfg['data']['init_args']
    assert cfg['model']['class_path'] == 'zoo.recipes.lm.CausalLM'
    assert zoo.model_info(model['name']).task == 'language_modeling' and data['task'] in TASKS
    opt, sched = model['optimizer'], model['lr_scheduler']
    assert opt['class_path'] == 'torch.optim.AdamW' and sched['class_path'] == 'zoo.recipes.optim.WarmupCosine'
    assert tuple(opt['init_args']['betas']) == (0.9, 0.98) and opt['init_args']['eps'] == 1e-6
    assert sched['init_args']['min_lr_ratio'] == 0.1
    task = __import__('zoo.datasets.synthetic', fromlist=['make_task']).make_task(data['task'], **data['task_args'])
    hardest = task.hardest(np.random.default_rng(0))
    assert len(hardest) <= data['context_length'] + 1, 'the hardest instance must fit in one window'


def test_zoo_fit_runs_an_lm_config_end_to_end(tmp_path, one_thread):
    from zoo.recipes.cli import run_lightning_cli
    path = next(p for p in CONFIGS if p.stem == 'llama_tiny_canon_copy')
    rc = run_lightning_cli(['fit', '-c', str(path), '--trainer.fast_dev_run', 'true', '--run_root', str(tmp_path),
                            '--trainer.enable_progress_bar', 'false'])
    assert rc in (0, None)
    assert [p for p in tmp_path.glob('llama_tiny_canon_copy/*') if p.is_dir()], 'zoo fit made a run folder'
