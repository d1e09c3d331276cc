"""Synthetic reasoning tasks of "Physics of Language Models: Part 4.1" (Z. Allen-Zhu, arXiv 2512.17351):
the token-copy probe, Depo (reasoning depth), Brevo (reasoning breadth) and Mano (knowledge manipulation).

Written from the paper's rules (the released generators in facebookresearch/PhysicsLM4
``data-synthetic-pretrain/`` have known bugs and are not used). Every task builds one instance from a
``numpy.random.Generator`` and a difficulty ``n``; ``pack_window`` streams instances into a fixed-length
context window. All generation is deterministic given the seed.

Token ids: 0 is padding; content tokens (names, operands) come next; special tokens (``<bos>``,
``<query>``, ``<ans>``, ...) sit at the top of each task's vocabulary, all distinct.

An instance is a list of token ids plus, per token, an answer id (>= 0 on tokens the loss is taken on,
one id per answer so an answer counts as correct only if all its tokens are) and a tag (Depo: the
query's hop count k; used to report accuracy at k = K and K/2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ['Instance', 'TokenCopy', 'Depo', 'Brevo', 'Mano', 'TASKS', 'make_task', 'difficulty_probs',
           'sample_difficulty', 'pack_window', 'mano_eval', 'brevo_check', 'brevo_depth']


def difficulty_probs(n_max: int, n_min: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Support and probabilities of the paper's difficulty law P(n) ∝ 1 / (n + sqrt(N)) on [n_min, N]."""
    if n_max < n_min:
        raise ValueError(f'the hardest size N={n_max} must be at least {n_min}')
    ns = np.arange(n_min, n_max + 1)
    w = 1.0 / (ns + math.sqrt(n_max))
    return ns, w / w.sum()


def sample_difficulty(rng: np.random.Generator, n_max: int, n_min: int = 3) -> int:
    ns, p = difficulty_probs(n_max, n_min)
    return int(rng.choice(ns, p=p))


@dataclass
class Instance:
    tokens: list[int]
    answer: list[int]          # per token: answer id (>= 0: loss and accuracy on this token), -1 elsewhere
    tag: list[int]             # per token: a label for stratified accuracy (Depo: k), 0 elsewhere
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)


class _Builder:
    """Accumulates tokens with their answer ids and tags."""

    def __init__(self):
        self.tokens, self.answer, self.tag, self._next = [], [], [], 0

    def add(self, toks, answer: bool = False, tag: int = 0, new_answer: bool = False):
        if new_answer:
            self._next += 1
        toks = [toks] if isinstance(toks, (int, np.integer)) else list(toks)
        self.tokens += [int(t) for t in toks]
        self.answer += [self._next - 1 if answer else -1] * len(toks)
        self.tag += [tag] * len(toks)

    def build(self, **meta) -> Instance:
        return Instance(self.tokens, self.answer, self.tag, meta)


def sample_names(rng: np.random.Generator, count: int, vocab: int, min_len: int, max_len: int,
                 offset: int = 1) -> list[tuple[int, ...]]:
    """``count`` distinct names; a name of l tokens takes its first l-1 tokens from [1, V] and its last from
    [V+1, 2V] (an implicit word boundary), shifted by ``offset - 1``."""
    capacity = sum(vocab ** l for l in range(min_len, max_len + 1))
    if count > capacity:
        raise ValueError(f'cannot draw {count} distinct names of {min_len}-{max_len} tokens from vocab {vocab} '
                         f'(only {capacity} exist); raise the vocab or the name length')
    names, seen = [], set()
    while len(names) < count:
        length = int(rng.integers(min_len, max_len + 1))
        body = rng.integers(1, vocab + 1, size=length - 1)
        last = rng.integers(vocab + 1, 2 * vocab + 1)
        name = tuple(int(t) + offset - 1 for t in (*body, last))
        if name not in seen:
            seen.add(name)
            names.append(name)
    return names


class _Task:
    name = ''
    pad = 0

    def sample(self, rng: np.random.Generator) -> Instance:
        return self.instance(rng, sample_difficulty(rng, self.N))

    def hardest(self, rng: np.random.Generator, **kw) -> Instance:
        return self.instance(rng, self.N, **kw)


class TokenCopy(_Task):
    """Token copy (paper Figure 5): ``<bos> x_1 .. x_N <query> x_1 .. x_N`` with x a random permutation of the
    N content tokens; loss only on the N copied tokens (each its own answer). ``random_length=True`` samples
    the length from the difficulty law instead of always using N."""
    name = 'copy'

    def __init__(self, N: int = 64, random_length: bool = False):
        self.N, self.random_length = N, random_length
        self.bos, self.query = N + 1, N + 2
        self.vocab_size = N + 3

    def sample(self, rng):
        return self.instance(rng, sample_difficulty(rng, self.N) if self.random_length else self.N)

    def instance(self, rng, n: int) -> Instance:
        perm = rng.permutation(self.N)[:n] + 1
        b = _Builder()
        b.add([self.bos, *perm, self.query])
        for t in perm:
            b.add(t, answer=True, new_answer=True)
        return b.build(sequence=perm.tolist())


class Depo(_Task):
    """Depo: n distinct names on one random cycle; the n edges ``x succ(x)`` in random order, then
    min(10, n) queries ``<query_k> q <ans> a`` on distinct nodes with a = the k-th successor of q, k ~ U[1, K].
    Loss on ``<ans>`` and the answer's tokens. Depo1: names of 1-2 tokens, V = 50; Depo2: 5-7 tokens, V = 4;
    ``name_len=(1, 1)`` gives the single-token Depo1-mini."""

    def __init__(self, N: int = 225, K: int = 8, vocab: int = 50, name_len: tuple[int, int] = (1, 2),
                 name: str = 'depo'):
        self.N, self.K, self.vocab, self.name_len, self.name = N, K, vocab, tuple(name_len), name
        base = 2 * vocab + 1
        self.bos, self.ans = base, base + 1
        self.query_ids = [base + 1 + k for k in range(1, K + 1)]          # <query_k>, k = 1..K
        self.vocab_size = base + 2 + K
        sample_names(np.random.default_rng(0), N, vocab, *self.name_len)   # fail early if N names cannot exist

    def instance(self, rng, n: int, k: int | tuple[int, ...] | None = None) -> Instance:
        """``k``: hop count of every query, or a tuple to draw it from (evaluation); default U[1, K]."""
        names = sample_names(rng, n, self.vocab, *self.name_len)
        cycle = rng.permutation(n)                                        # x_{cycle[i]} -> x_{cycle[i+1]}
        succ = np.empty(n, dtype=int)
        succ[cycle] = np.roll(cycle, -1)
        b = _Builder()
        b.add(self.bos)
        for x in rng.permutation(n):
            b.add(names[x])
            b.add(names[succ[x]])
        queries = []
        for q in rng.choice(n, size=min(10, n), replace=False):
            if k is None:
                hops = int(rng.integers(1, self.K + 1))
            else:
                hops = int(rng.choice(k)) if isinstance(k, (tuple, list)) else int(k)
            a = int(q)
            for _ in range(hops):
                a = int(succ[a])
            b.add([self.query_ids[hops - 1], *names[q]], tag=hops)
            b.add(self.ans, answer=True, tag=hops, new_answer=True)
            b.add(names[a], answer=True, tag=hops)
            queries.append((int(q), hops, a))
        return b.build(names=names, succ=succ.tolist(), queries=queries)


class Brevo(_Task):
    """Brevo: a random DAG on n nodes (out-degree <= 4, parents earlier in a hidden order, the first
    L ~ U{1..floor((n-1)/4)+1} nodes are leaves), edges ``p c`` in random order, then ``<query> q <ans>``
    followed by every ancestor of q in a topological order (leaves first) and ``<eos>``. The query is a random
    node with >= 1 parent from the last quarter of the order (the paper's rule, not the released code's).
    Loss on ``<ans>``, the answer and ``<eos>``. Brevo1: single-token names from {1..N}; Brevo2: 2-4 tokens, V = 4."""

    def __init__(self, N: int = 70, vocab: int | None = None, name_len: tuple[int, int] = (1, 1), name: str = 'brevo'):
        self.N, self.name_len, self.name = N, tuple(name_len), name
        self.single = self.name_len == (1, 1)
        self.vocab = N if vocab is None and self.single else (vocab or 4)
        base = (self.vocab if self.single else 2 * self.vocab) + 1
        self.bos, self.query, self.ans, self.eos = base, base + 1, base + 2, base + 3
        self.vocab_size = base + 4

    def _names(self, rng, n):
        if self.single:
            return [(int(t) + 1,) for t in rng.permutation(self.vocab)[:n]]
        return sample_names(rng, n, self.vocab, *self.name_len)

    def graph(self, rng, n: int):
        """parents[i] for nodes in insertion order 0..n-1 (a topological order) and the query node."""
        leaves = int(rng.integers(1, (n - 1) // 4 + 2))
        parents, outdeg = [[] for _ in range(n)], np.zeros(n, dtype=int)
        for i in range(leaves, n):
            eligible = np.flatnonzero(outdeg[:i] < 4)
            if len(eligible) == 0:
                continue
            num = int(rng.integers(1, min(4, len(eligible)) + 1))
            for p in rng.choice(eligible, size=num, replace=False):
                parents[i].append(int(p))
                outdeg[p] += 1
        start = min(3 * n // 4, n - 1)
        candidates = [i for i in range(start, n) if parents[i]]
        if not candidates:  # rare: no node of the last quarter has a parent; any node with a parent
            candidates = [i for i in range(n) if parents[i]]
        return parents, int(rng.choice(candidates))

    def instance(self, rng, n: int) -> Instance:
        if self.single and n > self.vocab:
            raise ValueError(f'Brevo with single-token names needs n <= vocab={self.vocab}, got {n}')
        parents, q = self.graph(rng, n)
        names = self._names(rng, n)
        edges = [(p, c) for c in range(n) for p in parents[c]]
        anc, stack = set(), list(parents[q])
        while stack:
            x = stack.pop()
            if x not in anc:
                anc.add(x)
                stack += parents[x]
        depth = {}                                  # longest path from a root (= brevo_depth), leaves first
        for i in range(n):
            depth[i] = 1 + max((depth[p] for p in parents[i]), default=-1)
        order = sorted(anc, key=lambda x: (depth[x], rng.random()))
        b = _Builder()
        b.add(self.bos)
        for e in rng.permutation(len(edges)):
            p, c = edges[e]
            b.add([*names[p], *names[c]])
        b.add([self.query, *names[q]])
        b.add(self.ans, answer=True, new_answer=True)
        for x in order:
            b.add(names[x], answer=True)
        b.add(self.eos, answer=True)
        return b.build(names=names, parents=parents, query=q, ancestors=sorted(anc), order=order, depth=depth[q])


def brevo_depth(parents: list[list[int]], node: int) -> int:
    """Depth of ``node``'s ancestor sub-DAG (the paper stratifies Brevo's accuracy by it): the number of edges
    on the longest path from a root (a node without parents) to ``node``; 0 for a root, 1 if every parent is a
    root. ``parents[i]``: the parents of node i. Every path into ``node`` runs through its ancestors, so this is
    the longest chain of dependencies the model has to resolve in the sub-DAG."""
    depth: dict[int, int] = {}
    stack = [node]                                  # iterative post-order: a deep DAG must not hit the recursion limit
    while stack:
        y = stack[-1]
        todo = [p for p in parents[y] if p not in depth]
        if todo:
            stack += todo
            continue
        stack.pop()
        depth[y] = 1 + max((depth[p] for p in parents[y]), default=-1)
    return depth[node]


def brevo_check(inst: Instance, generated: list[int], eos: int) -> bool:
    """The paper's Brevo metric: the generated answer (tokens after ``<ans>``) must list exactly the ancestor
    set, no duplicates, in a valid topological order (any), ending with ``<eos>``."""
    names, parents = inst.meta['names'], inst.meta['parents']
    if eos not in generated:
        return False
    body = generated[:generated.index(eos)]
    index = {nm: i for i, nm in enumerate(names)}
    got, cur = [], []
    last_tokens = {nm[-1] for nm in names}
    for t in body:                                                          # split by the last-token rule
        cur.append(t)
        if t in last_tokens or len(names[0]) == 1:
            if tuple(cur) not in index:
                return False
            got.append(index[tuple(cur)])
            cur = []
    if cur or len(set(got)) != len(got) or set(got) != set(inst.meta['ancestors']):
        return False
    pos = {x: i for i, x in enumerate(got)}
    return all(pos[p] < pos[x] for x in got for p in parents[x])


# ------------------------------------------------------------------------------------------------ Mano
MOD = 23
_OPS = {1: '+', 2: '-', 3: '*'}


def mano_eval(expr: list) -> int:
    """Evaluate a nested (op, left, right) / int expression mod 23 directly (the tests' reference)."""
    if isinstance(expr, int):
        return expr % MOD
    op, left, right = expr
    a, b = mano_eval(left), mano_eval(right)
    return {'+': a + b, '-': a - b, '*': a * b}[op] % MOD


class Mano(_Task):
    """Mano: a prefix expression with l ~ U[1, L] operators over {+, -, *} mod 23, operands U[0, 22]; the operator
    is uniform, the left subtree gets l' ~ U[0, l-1] operators and the right l-1-l'.
    Format ``<bos> <len_l> prefix-tokens <ans> value``. The paper trains on all tokens (``loss_on='all'``);
    ``loss_on='answer'`` keeps only the value. Accuracy: the value token at l = L."""

    def __init__(self, L: int = 10, loss_on: str = 'all', name: str = 'mano'):
        if loss_on not in ('all', 'answer'):
            raise ValueError(f"loss_on must be 'all' or 'answer', got {loss_on!r}")
        self.L, self.N, self.loss_on, self.name = L, L, loss_on, name
        self.op_ids = {'+': MOD + 1, '-': MOD + 2, '*': MOD + 3}            # operands are 1..23 (value v -> v+1)
        self.len_ids = [MOD + 4 + l for l in range(L)]                        # <len_l>, l = 1..L
        self.bos, self.ans = MOD + 4 + L, MOD + 5 + L
        self.vocab_size = MOD + 6 + L

    def tree(self, rng, ops: int):
        if ops == 0:
            return int(rng.integers(0, MOD))
        op = _OPS[int(rng.integers(1, 4))]
        left = int(rng.integers(0, ops))
        return (op, self.tree(rng, left), self.tree(rng, ops - 1 - left))

    def _prefix(self, e) -> list[int]:
        if isinstance(e, int):
            return [e + 1]
        return [self.op_ids[e[0]], *self._prefix(e[1]), *self._prefix(e[2])]

    def sample(self, rng):
        return self.instance(rng, int(rng.integers(1, self.L + 1)))

    def instance(self, rng, n: int) -> Instance:
        expr = self.tree(rng, n)
        value = mano_eval(expr)
        b = _Builder()
        everything = self.loss_on == 'all'
        b.add(self.bos)
        b.add([self.len_ids[n - 1], *self._prefix(expr), self.ans], answer=everything, new_answer=everything)
        b.add(value + 1, answer=True, tag=1, new_answer=True)                # tag 1 marks the value token
        return b.build(expr=expr, value=value, ops=n)


TASKS = {
    'copy': lambda **kw: TokenCopy(**kw),
    'depo1': lambda **kw: Depo(**{'N': 225, 'K': 8, 'vocab': 50, 'name_len': (1, 2), 'name': 'depo1', **kw}),
    'depo1_mini': lambda **kw: Depo(**{'N': 24, 'K': 4, 'vocab': 32, 'name_len': (1, 1), 'name': 'depo1_mini', **kw}),
    'depo2': lambda **kw: Depo(**{'N': 75, 'K': 16, 'vocab': 4, 'name_len': (5, 7), 'name': 'depo2', **kw}),
    'brevo1': lambda **kw: Brevo(**{'N': 70, 'name': 'brevo1', **kw}),
    'brevo2': lambda **kw: Brevo(**{'N': 30, 'vocab': 4, 'name_len': (2, 4), 'name': 'brevo2', **kw}),
    'mano': lambda **kw: Mano(**kw),
}


def make_task(task: str, **kwargs) -> _Task:
    if task not in TASKS:
        raise ValueError(f'unknown synthetic task {task!r}; expected one of {", ".join(TASKS)}')
    return TASKS[task](**kwargs)


def pack_window(task: _Task, rng: np.random.Generator, length: int, hardest: bool = False,
                **kw) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Instance]]:
    """Fill one window of ``length`` tokens with whole instances, left-aligned (the first starts at 0 and no
    instance is ever cut; the rest is padding with no loss). Returns tokens, answer ids, tags, instances."""
    tokens = np.zeros(length, dtype=np.int64)
    answer = np.full(length, -1, dtype=np.int64)
    tag = np.zeros(length, dtype=np.int64)
    pos, offset, insts = 0, 0, []
    while True:
        inst = task.hardest(rng, **kw) if hardest else task.sample(rng)
        if len(inst) > length and pos == 0:
            raise ValueError(f'a {task.name} instance has {len(inst)} tokens but the context is {length}; '
                             f'raise the context length or lower the task size')
        if pos + len(inst) > length:
            break
        tokens[pos:pos + len(inst)] = inst.tokens
        ans = np.asarray(inst.answer)
        answer[pos:pos + len(inst)] = np.where(ans >= 0, ans + offset, -1)
        tag[pos:pos + len(inst)] = inst.tag
        offset += max(inst.answer) + 1
        pos += len(inst)
        insts.append(inst)
    return tokens, answer, tag, insts
