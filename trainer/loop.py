"""The RL loop: GRPO against a long-lived rollout server over SGLang's native HTTP API. Per step: n samples per
prompt, concurrently (harvest hook); rewards and group-normalised advantages; one AdamW step on the PPO-clipped
loss (+ k3 KL); weight_v{step} saved atomically, checked against the serving model and pushed with
`weight_version = step` (`trainer.run.PolicyPusher`: `update_weights_from_disk`, or a `selector: "target"` tensor
session for stock SGLang with EAGLE-3; no NCCL broadcast). Simplified relative to DeepSeekMath GRPO, DAPO and slime:
- One update per step (no PPO epochs): rollouts are on-policy, so the ratio only absorbs the server/trainer mismatch
  (`logprob_mismatch`); clipping stays as slime's safety net. Old logprobs are the server's: a forward saved, and
  engine bugs show in the mismatch.
- Token-level normalisation (DAPO) over informative groups: without KL an all-equal-reward group (advantage 0) is
  left out (DAPO's filter, no re-sampling); a step with none runs the optimizer on zero gradients, no forward or
  backward. No length penalty; KL off by default (rule-based rewards need no reward-model guard).
- `negative_weight` < 1 scales down negative advantages (PSR); the demo keeps plain GRPO (1). On the demo's small
  policy the step size decides first: lr 2e-4 made it worse in 4 of 5 runs of 12 steps; lr 1e-4, 16 prompts x 4
  raised held-out T=1 accuracy on each of 5 seeds (docs/rl-gain.md, issue 23).
- Synchronous: step N+1's rollouts start after step N's push, so every rollout is sampled by the trainer's version;
  the long tail is what the harvester gleans. The update may take every core (`trainer.phases`), and its forward
  hands the harvester the rollouts' hidden states (`hooks.update_capture()`), saving an idle-window pass.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import torch

from gleanrl.clients.rollout import Rollout
from gleanrl.clients.weight_sync import DrafterPush
from gleanrl.trainer.checkpoint import list_checkpoints, load_latest
from gleanrl.trainer.config import TrainConfig, write_resolved
from gleanrl.trainer.generate import make_rollouts, sampling_params
from gleanrl.trainer.hooks import NoHooks, RolloutHooks, missing_hooks
from gleanrl.trainer.layout import IdleCores, Replicas, layout_groups
from gleanrl.trainer.metrics import rollout_metrics, step_shares
from gleanrl.trainer.policy import Policy
from gleanrl.trainer.run import Run, score
from gleanrl.trainer.server_proc import ServeSD
from gleanrl.trainer.tasks.base import Task


def train(
    cfg: TrainConfig,
    task: Task | None = None,
    hooks: RolloutHooks | None = None,
    resume: bool = False,
    log=print,
    replicas: Replicas | None = None,
) -> dict:
    """Run `cfg.steps` GRPO steps (from the last checkpoint with `resume`); returns the last metrics row.
    `hooks` default: `HarvestHooks` with `cfg.drafter`, else none. Servers: `cfg.servers`, else `replicas`
    (the caller's, e.g. the demo's), else embedded replicas laid out by `cfg.replicas`, started here."""
    if hooks is not None and (missing := missing_hooks(hooks)):
        raise TypeError(f"hooks lack {', '.join(missing)} (trainer.hooks.RolloutHooks; subclass NoHooks)")
    torch.set_num_threads(cfg.trainer_threads)
    torch.manual_seed(cfg.seed)
    task = task or _load_task(cfg)
    resumed = load_latest(cfg.out) if resume else None
    if not resume and list_checkpoints(cfg.out):
        raise ValueError(f"{cfg.out} already holds step checkpoints: pass --resume to continue, or use another --out")
    write_resolved(cfg, cfg.out)
    policy = Policy(cfg, str(resumed.path) if resumed else cfg.model)
    sd = None
    if cfg.drafter and hooks is None:
        from gleanrl.harvest.hooks import HarvestHooks

        root = Path(cfg.out) / "harvest"
        hooks, drafter = HarvestHooks.for_run(cfg.model, cfg.drafter, root, resume)
        sd = ServeSD(str(drafter))  # the embedded server serves the newest pushed drafter
    hooks = NoHooks() if hooks is None else hooks
    if resumed:
        policy.optimizer.load_state_dict(resumed.optimizer_state)
        if resumed.hooks_state is not None:  # e.g. the Harvester's drafter in training, its version
            hooks.load_state_dict(resumed.hooks_state)
        log(f"resuming after step {resumed.step} from {resumed.path}")
    weights = (str(resumed.path) if resumed else cfg.model, str(resumed.step if resumed else 0))
    if cfg.servers and replicas:
        raise ValueError("give either cfg.servers or replicas, not both")
    own = None
    if not (cfg.servers or replicas):
        groups = layout_groups(cfg.replicas, cfg.serve, hooks.harvests)
        log_path, threads = f"{cfg.out}/server.log", cfg.server_threads or None
        own = Replicas(cfg.model, groups, cfg.serve, cfg.api_key, cfg.admin_api_key, log_path, sd=sd, threads=threads)
    try:
        if own:
            own.start()
        run = Run(cfg, task, policy, hooks, own or replicas, weights, log)
        return asyncio.run(_loop(run, resumed.step if resumed else 0))
    finally:
        if own:
            own.stop()


async def _loop(run: Run, start: int) -> dict:
    """The algorithm: rollouts (harvested as they finish), rewards, one update, save, push."""
    cfg, task, policy, hooks = run.cfg, run.task, run.policy, run.hooks
    row: dict = {}
    async with run.client:
        await run.resync()
        if start == 0 and cfg.eval_every:
            first = {"step": 0, "weight_version": "0", **await run.evaluate(0)}
            run.metrics.log(first, echo=run.log)
        hooks.bind_push(DrafterPush.for_client(run.client))  # drafters go to the same servers
        gated = bool(run.servers) and len(run.servers.servers) > 1
        if gated:  # the harvest on the cores of replicas that finished, never beside a busy one
            hooks.bind_cores(IdleCores(run.client.in_flight, run.servers.cores()))
        sched = await run.check_scheduling() if hooks.harvests and start == 0 and not gated else {}
        for step in range(start + 1, cfg.steps + 1):
            rollouts = make_rollouts(cfg, task, policy.tokenizer, step)
            hooks.on_step_start(step, policy.model)
            t0 = time.monotonic()
            await run.generate(rollouts, sampling_params(cfg), hooks)  # idle window, finishers
            t1 = time.monotonic()
            score(task, policy.tokenizer, rollouts)
            batch = informative(rollouts) if cfg.kl_coef == 0 else rollouts
            train_stats = run.update(batch)  # its forward feeds hooks.update_capture()
            rollout_version = run.version
            run.checkpoint(step)  # with hooks.state_dict()
            t2 = time.monotonic()
            await run.push()
            row = {
                "step": step,
                "weight_version": run.version,
                "rollout_weight_version": rollout_version,
                **rollout_metrics(rollouts, t0, t1, run.correct),
                "train_s": t2 - t1,
                "push_s": time.monotonic() - t2,
                "train_rollouts": len(batch),
                **train_stats,
                **hooks.step_metrics(),
                **(sched if step == start + 1 else {}),
            }
            row |= step_shares(row) | await run.evaluate(step)
            run.metrics.log(row, echo=run.log)
            if row.get("push_why"):  # the drafter gate's word: pushed, or why not yet
                run.log(f"drafter gate: {row['push_why']}")
    return row


def informative(rollouts: list[Rollout]) -> list[Rollout]:
    """The rollouts of groups whose rewards differ: the others have advantage 0 everywhere."""
    rewards: dict[int, set[float]] = {}
    for r in rollouts:
        rewards.setdefault(r.group_id, set()).add(float(r.reward))
    return [r for r in rollouts if len(rewards[r.group_id]) > 1]


def _load_task(cfg: TrainConfig) -> Task:
    from gleanrl.trainer.tasks import load_task

    return load_task(cfg.data or cfg.task)
