"""One step's rollouts: submit all concurrently, consume each as it finishes, survive a server that dies or restarts
mid-step (re-sync the weights, re-submit what was lost), and keep rollouts of any other weight_version out of training.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tqdm import tqdm

from gleanrl.clients.rollout import Rollout, RolloutStatus, run_rollout
from gleanrl.clients.rollout_client import RolloutClient
from gleanrl.clients.transport import RolloutServerError
from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.hooks import RolloutHooks
from gleanrl.trainer.tasks.base import Task


async def run_step(
    client: RolloutClient,
    rollouts: list[Rollout],
    params: dict,
    cfg: TrainConfig,
    expected_version: str,
    resync: Callable[[], Awaitable[None]],
    hooks: RolloutHooks,
    stream: bool,
    log=print,
    desc: str = "rollouts",
) -> None:
    """Run every rollout to completion (finished or truncated, sampled by `expected_version`), each submitted at
    most `cfg.max_attempts` times. `resync()`, run before re-submitting, waits for the server and re-pushes the
    current weights."""
    pending = list(rollouts)
    bar = tqdm(total=len(rollouts), desc=desc, unit="req", leave=False, dynamic_ncols=True)
    try:
        while pending:
            with hooks.idle_window():
                urls = spread(client, pending)
                interval = cfg.stream_interval
                go = [run_rollout(client, r, params, stream, interval, urls.get(r.group_id)) for r in pending]
                for fut in asyncio.as_completed([asyncio.create_task(run) for run in go]):
                    r = await fut
                    if r.done and r.weight_version in (expected_version, None):
                        bar.update(1)
                        hooks.on_rollout_finished(r)
            redo = [r for r in pending if not (r.done and r.weight_version in (expected_version, None))]
            if not redo:
                if any(r.weight_version is None for r in rollouts):
                    log(f"warning: the server reports no weight_version; trusting it holds {expected_version}")
                return
            bad = [r for r in redo if r.status == RolloutStatus.FAILED]
            if bad:  # the server refused the request: re-submitting will not help
                raise RolloutServerError(client.urls[0], 400, f"rollout {bad[0].rid} failed: {bad[0].error}")
            stale = [r for r in redo if r.done]
            if stale:
                got = f"weight_version {stale[0].weight_version}, expected {expected_version}"
                log(f"warning: {len(stale)} rollout(s) sampled by {got}: discarded and re-submitted")
            exhausted = [r for r in redo if r.attempts >= cfg.max_attempts]
            if exhausted:
                why = f"{len(exhausted)} rollout(s) still unfinished after {cfg.max_attempts} attempts"
                raise RolloutServerError(client.urls[0], 0, f"{why} (last: {exhausted[0].error})")
            log(f"warning: {len(redo)} rollout(s) lost ({redo[0].error}); re-syncing the server and re-submitting")
            await resync()
            for r in redo:
                r.reset()
            pending = redo
    finally:
        bar.close()


def spread(client: RolloutClient, rollouts: list[Rollout]) -> dict[int, str]:
    """Each group's server when there are several and no router: a prompt's samples to one server, groups dealt
    out in turn (group drafts see a prompt's siblings; equal shares); {} lets the client pick."""
    if client.router or len(client.urls) < 2:
        return {}
    groups = dict.fromkeys(r.group_id for r in rollouts)
    return {g: client.urls[i % len(client.urls)] for i, g in enumerate(groups)}


def sampling_params(cfg: TrainConfig) -> dict:
    return {"max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature, "top_p": cfg.top_p}


def make_rollouts(
    cfg: TrainConfig,
    task: Task,
    tokenizer,
    step: int,
    split: str = "train",
    n: int | None = None,
    samples: int | None = None,
) -> list[Rollout]:
    """`samples_per_prompt` pending rollouts per prompt of the step; seeds make it reproducible (the server samples
    each seeded request from its own generator)."""
    prompts = task.prompts(split, n or cfg.prompts_per_step, seed=cfg.seed * 100_003 + step)
    out = []
    for g, sample in enumerate(prompts):
        ids = encode_prompt(tokenizer, sample)
        for i in range(samples or cfg.samples_per_prompt):
            seed = (cfg.seed * 1_000_003 + step * 10_007 + g * 101 + i) % 2**31
            rid = f"{split}{step}-g{g}-i{i}-{seed}"
            out.append(Rollout(group_id=g, index=i, sample=sample, prompt_ids=ids, rid=rid, seed=seed))
    return out


def encode_prompt(tokenizer, sample: dict) -> list[int]:
    """The task's "prompt_ids", else its "prompt" (chat template applied) encoded as the server encodes `text`."""
    if "prompt_ids" in sample:
        return list(sample["prompt_ids"])
    return list(tokenizer.encode(sample["prompt"]))
