"""The batched tree pass on the tiny target: with any two branches per sequence (right, partly
right, wrong, empty, same first token) greedy decoding emits exactly the plain greedy continuation,
and the caches stay exactly those of plain decoding."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from gleanrl.server.model.runner import ModelRunner
from gleanrl.server.sampling.sampler import params_tensors
from gleanrl.server.sd.tree_pass import tree_pass


@dataclass(eq=False)
class _Seq:
    prompt: list[int]
    cache: object
    output_ids: list[int] = field(default_factory=list)
    req: SimpleNamespace = field(
        default_factory=lambda: SimpleNamespace(
            params=SimpleNamespace(
                temperature=0.0, top_k=-1, top_p=1.0, min_p=0.0, penalised=False, logits_processed=False
            ),
            return_logprob=True,
            top_logprobs_num=0,
            token_ids_logprob=None,
        )
    )
    generator: torch.Generator | None = None

    def tokens(self, start, end):
        return (self.prompt + self.output_ids)[start:end]


def _greedy(runner: ModelRunner, prompt: list[int], n: int) -> list[int]:
    cache, ids = runner.new_cache(), list(prompt)
    logits, _ = runner.forward(torch.tensor(ids), torch.arange(len(ids)), [cache], [len(ids)])
    for _ in range(n):
        ids.append(int(logits[0].argmax()))
        logits, _ = runner.forward(torch.tensor(ids[-1:]), torch.tensor([len(ids) - 1]), [cache], [1])
    return ids[len(prompt) :]


def _branches(rng: random.Random, truth: list[int], vocab: int) -> list[list[int]]:
    def one() -> list[int]:
        k, right = rng.randint(0, 5), rng.randint(0, 5)
        return [t if j < right else rng.randrange(vocab) for j, t in enumerate(truth[:k])]

    return [one() for _ in range(rng.choice([1, 2]))]


def test_greedy_tree_passes_emit_the_plain_continuation(tiny_qwen2):
    runner = ModelRunner.load(str(tiny_qwen2))
    rng, n_new = random.Random(0), 24
    prompts = [[rng.randrange(runner.vocab_size) for _ in range(rng.randint(3, 9))] for _ in range(5)]
    # identical prompts
    prompts.append(list(prompts[0]))
    want = [_greedy(runner, p, n_new + 8) for p in prompts]
    seqs = [_Seq(p, runner.new_cache(capacity=4)) for p in prompts]
    for s in seqs:
        # prefill all but the last
        runner.forward(torch.tensor(s.prompt[:-1]), torch.arange(len(s.prompt) - 1), [s.cache], [len(s.prompt) - 1])
    accepted = 0
    while any(len(s.output_ids) < n_new for s in seqs):
        live = [s for s in seqs if len(s.output_ids) < n_new]
        truth = [want[seqs.index(s)][len(s.output_ids) :] for s in live]
        branches = [_branches(rng, t, runner.vocab_size) for t in truth]
        results, _ = tree_pass(
            runner, live, branches, [[None] * len(b) for b in branches], params_tensors([s.req.params for s in live])
        )
        for s, r, t in zip(live, results, truth):
            assert r.ids == t[: len(r.ids)]
            assert len(r.logprobs) == len(r.ids) and all(lp <= 0 for lp in r.logprobs)
            s.output_ids += r.ids
            accepted += r.accepted
            assert s.cache.length == len(s.prompt) + len(s.output_ids) - 1
    # the drafts were used
    assert accepted > 20
    for s, w in zip(seqs, want):
        assert s.output_ids == w[: len(s.output_ids)]
