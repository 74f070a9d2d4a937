"""`gleanrl bench group-index`: the group index's cost per `propose` and per one-token `extend` call, as
the engine makes them every decode iteration, on synthetic GRPO groups (P prompts x n samples of L
tokens, each a copy of its prompt's reference continuation with a mutation rate, so siblings agree in
stretches). Per call, best of --repeats; mean_draft_len: the mean length of the drafts proposed."""

from __future__ import annotations

import argparse
import json
import random
import time

from gleanrl.server.sd.group_index import GroupIndex, GroupIndexConfig, prompt_key


def _samples(rng: random.Random, prompts: int, n: int, length: int, vocab: int, mutate: float):
    groups = []
    for _ in range(prompts):
        prompt = [rng.randrange(vocab) for _ in range(32)]
        ref = [rng.randrange(vocab) for _ in range(length)]
        groups.append((prompt, [[t if rng.random() > mutate else rng.randrange(vocab) for t in ref] for _ in range(n)]))
    return groups


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=8, help="P: groups")
    parser.add_argument("--n", type=int, default=8, help="samples per group")
    parser.add_argument("--length", type=int, default=2048, help="L: tokens per sample")
    parser.add_argument("--vocab", type=int, default=2000, help="vocabulary size")
    parser.add_argument("--mutate", type=float, default=0.1, help="share of a sample's tokens unlike the reference")
    parser.add_argument("--max-len", type=int, default=32, help="longest draft proposed")
    parser.add_argument("--repeats", type=int, default=3, help="runs per timing (the best counts)")


def run(args: argparse.Namespace) -> int:
    rng = random.Random(0)
    groups = _samples(rng, args.prompts, args.n, args.length, args.vocab, args.mutate)
    best_extend = best_propose = float("inf")
    for _ in range(args.repeats):
        index = GroupIndex(GroupIndexConfig())
        handles = [[index.start(prompt, "v0") for _ in outs] for prompt, outs in groups]
        t_extend = t_propose = 0.0
        hits = calls = drafted = 0
        for pos in range(args.length):  # every sample emits one token per iteration
            for (prompt, outs), hs in zip(groups, handles):
                key = prompt_key(prompt)
                for out, h in zip(outs, hs):
                    recent = (prompt[-4:] + out[max(pos - 4, 0) : pos])[-4:]
                    t0 = time.perf_counter()
                    draft = index.propose(key, recent, args.max_len)
                    t1 = time.perf_counter()
                    index.extend(h, [out[pos]])
                    t_extend += time.perf_counter() - t1
                    t_propose += t1 - t0
                    calls += 1
                    hits += draft is not None
                    drafted += len(draft.tokens) if draft is not None else 0
        best_extend, best_propose = min(best_extend, t_extend / calls), min(best_propose, t_propose / calls)
    result = {"propose_us": round(best_propose * 1e6, 2), "extend_us": round(best_extend * 1e6, 2)}
    result |= {"hit_rate": round(hits / calls, 3), "mean_draft_len": round(drafted / max(hits, 1), 2)}
    print(json.dumps(result | {"calls": calls, "indexed_tokens": index.tokens}))
    return 0
