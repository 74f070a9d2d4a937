"""The RL loop: GRPO against a long-lived rollout server over SGLang's native HTTP API.

    for step in steps:
        prompts  = task.prompts("train", n, seed=step)
        rollouts = generate n samples per prompt concurrently (consumed as each finishes: harvest hook)
        rewards  = task.reward(...) ; advantages = group-normalised (GRPO)
        policy   = one AdamW step on the PPO-clipped loss with ratio vs the rollout logprobs (+ k3 KL)
        save weight_v{step} atomically ; push it with update_weights_from_disk(weight_version=step)

Simplified relative to the literature (DeepSeekMath GRPO, DAPO, slime) and why:
- One policy update per step (no PPO epochs over minibatches): the rollouts are exactly on-policy, so
  the importance ratio only absorbs the numerical mismatch between the server and the trainer (which
  we report as `logprob_mismatch`); clipping stays as the safety net it is in slime.
- The old-policy logprobs are the server's rollout logprobs, not a trainer recomputation: saves a
  forward pass and makes engine bugs visible in the mismatch metric instead of hiding them.
- Token-level normalisation (DAPO) over the step's informative groups: a group whose rewards are all
  equal has advantage 0, so without KL it is left out of the update (DAPO's dynamic-sampling filter,
  without its re-sampling); it would only cost a forward/backward and dilute the normalisation. A step
  with no informative group runs the optimizer on zero gradients (AdamW's momentum moves the weights
  exactly as an update on all-zero advantages would) without any forward or backward. No
  length penalty; KL to the initial policy off by default (rule-based rewards need no reward-model guard).
- `negative_weight` < 1 scales down negative advantages (the demo: 0.1). On a small SFT policy every
  full-weight GRPO recipe we tried left T=1 accuracy flat or worse within 12 steps; leaning on
  reinforcing successes sharpens it measurably (README, "Does RL help?"), at some cost in diversity.
- Synchronous: step N+1's rollouts start after the push of step N's weights, so every rollout is
  sampled by exactly the version the trainer holds; the long tail is what the harvester gleans. The
  phases never overlap, so the update may take every core while the server waits (`update_threads`,
  `update_cores`: `trainer.phases`), and its forward hands the harvester the hidden states of the
  rollouts it trains on (`hooks.update_capture()`), instead of a second pass in the idle window.
- Weight sync from the checkpoint written each step (`trainer.policy_push`, `clients.weight_sync`):
  checked against the serving model first, then `update_weights_from_disk`, or a `selector: "target"`
  tensor session for stock SGLang running EAGLE-3; no NCCL broadcast.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import torch

from gleanrl.clients.rollout import Rollout
from gleanrl.clients.rollout_client import RolloutClient
from gleanrl.clients.transport import RolloutServerError
from gleanrl.clients.weight_sync import DrafterPush
from gleanrl.trainer.checkpoint import list_checkpoints, load_latest, save_checkpoint
from gleanrl.trainer.config import TrainConfig, write_resolved
from gleanrl.trainer.generate import NoHooks, RolloutHooks, make_rollouts, run_step, sampling_params
from gleanrl.trainer.metrics import MetricsLog, eval_metrics, rollout_metrics, step_shares
from gleanrl.trainer.phases import all_cores, phase_threads
from gleanrl.trainer.policy import Policy
from gleanrl.trainer.policy_push import PolicyPusher
from gleanrl.trainer.server_proc import EmbeddedServer


def train(cfg: TrainConfig, task=None, hooks: RolloutHooks | None = None, resume: bool = False,
          log=print) -> dict:
    """Run `cfg.steps` GRPO steps (continuing from the last checkpoint with `resume`). Returns the last
    step's metrics row."""
    torch.set_num_threads(cfg.trainer_threads)
    torch.manual_seed(cfg.seed)
    task = task or _load_task(cfg)
    resumed = load_latest(cfg.out) if resume else None
    if not resume and list_checkpoints(cfg.out):
        raise ValueError(f"{cfg.out} already holds step checkpoints: pass --resume to continue, or use another --out")
    write_resolved(cfg, cfg.out)
    policy = Policy(cfg, str(resumed.path) if resumed else cfg.model)
    if resumed:
        policy.optimizer.load_state_dict(resumed.optimizer_state)
        log(f"resuming after step {resumed.step} from {resumed.path}")
    start = resumed.step if resumed else 0
    weights = (str(resumed.path) if resumed else cfg.model, str(start))
    server_args = list(cfg.server_args)
    if cfg.drafter and hooks is None:
        from gleanrl.harvest.hooks import HarvestHooks
        hooks, drafter = HarvestHooks.for_run(cfg.model, cfg.drafter, Path(cfg.out) / "harvest", resume)
        if "--drafter" not in server_args:  # the embedded server serves the newest pushed drafter
            server_args += ["--drafter", str(drafter)] + ([] if "--sd" in server_args else ["--sd", "adaptive"])
    if resumed and resumed.hooks_state is not None and hasattr(hooks, "load_state_dict"):
        hooks.load_state_dict(resumed.hooks_state)  # e.g. the Harvester's drafter in training, optimizer, version
    cores = len(all_cores())  # the server has the machine during rollouts, but for a harvester beside it
    harvest = hooks is not None and not isinstance(hooks, NoHooks)
    threads = cfg.server_threads or (max(cores // 2, 1) if harvest else cores)
    server = None if cfg.servers else EmbeddedServer(cfg.model, threads, server_args,
                                                    cfg.api_key, cfg.admin_api_key, f"{cfg.out}/server.log")
    try:
        if server:
            server.start()
        return asyncio.run(_loop(cfg, task, policy, hooks or NoHooks(), server, start, weights, log))
    finally:
        if server:
            server.stop()


async def _loop(cfg, task, policy: Policy, hooks, server, start: int, weights: tuple[str, str], log) -> dict:
    client = RolloutClient(cfg.servers or [server.url], cfg.api_key, cfg.admin_api_key, cfg.request_timeout_s,
                           router=cfg.router)
    pusher = PolicyPusher(client, cfg.model)
    metrics = MetricsLog(cfg.out, resume_step=start if start else None, harvest=hasattr(hooks, "step_metrics"))
    state = {"path": weights[0], "version": weights[1]}

    async def resync(attempts: int = 3) -> None:  # wait for the server(s), then make them serve our weights
        for attempt in range(attempts):
            if server:  # a kill may land between this check and the health poll: hence the attempts
                server.ensure_running()
            try:
                await client.wait_healthy(cfg.server_wait_s, alive=server.alive if server else None)
                break
            except RolloutServerError as exc:
                if server and attempt + 1 < attempts and not server.alive():
                    continue
                if server:  # the embedded server's own words say why
                    exc.message += f"; the end of {server.log_path}:\n{server.log_tail()}"
                    exc.args = (f"{exc.url}: {exc.message}",)
                raise
        await pusher.push(state["path"], state["version"])

    async def evaluate(step: int) -> dict:  # the same held-out prompts and seeds every time: paired evals
        if not cfg.eval_every or (step % cfg.eval_every and step != cfg.steps):
            return {}
        t0 = time.monotonic()
        row = {}
        for prefix, temperature, samples in [("eval", cfg.eval_temperature, cfg.eval_samples)] + (
                [("eval_greedy", 0.0, 1)] if cfg.eval_greedy and cfg.eval_temperature > 0 else []):
            rollouts = make_rollouts(cfg, task, policy.tokenizer, 0, split="test", n=cfg.eval_prompts, samples=samples)
            await run_step(client, rollouts, dict(sampling_params(cfg), temperature=temperature),
                           expected_version=state["version"], resync=resync, hooks=NoHooks(),
                           max_attempts=cfg.max_attempts, stream=False, log=log, desc=prefix)
            score(task, policy.tokenizer, rollouts)
            stats = eval_metrics(rollouts, lambda r: _correct(task, r), metrics.first(f"{prefix}_scores"))
            row |= {prefix + k[len("eval"):]: v for k, v in stats.items()}
        return row | {"eval_temperature": cfg.eval_temperature, "eval_s": time.monotonic() - t0}

    row: dict = {}
    async with client:
        await resync()
        if start == 0 and cfg.eval_every:
            metrics.log({"step": 0, "weight_version": "0", **await evaluate(0)}, echo=log)
        if hasattr(hooks, "bind_push"):  # harvest.hooks.HarvestHooks: push drafters to the same servers
            hooks.bind_push(DrafterPush.for_client(client))
        for step in range(start + 1, cfg.steps + 1):
            rollouts = make_rollouts(cfg, task, policy.tokenizer, step)
            hooks.on_step_start(step, policy.model)
            t0 = time.monotonic()
            await run_step(client, rollouts, sampling_params(cfg), expected_version=state["version"],
                           resync=resync, hooks=hooks, max_attempts=cfg.max_attempts, stream=cfg.stream,
                           stream_interval=cfg.stream_interval, log=log)
            t1 = time.monotonic()
            score(task, policy.tokenizer, rollouts)
            batch = informative(rollouts) if cfg.kl_coef == 0 else rollouts
            # micro-batches of similar lengths pad far less (the loss does not depend on the order)
            ordered = sorted(batch, key=lambda r: len(r.prompt_ids) + len(r.output_ids))
            capture = hooks.update_capture() if hasattr(hooks, "update_capture") else contextlib.nullcontext()
            with phase_threads(cfg.update_threads or cfg.trainer_threads, cfg.update_cores), capture as cap:
                train_stats = policy.train_step(ordered, capture=cap)
            path = save_checkpoint(cfg.out, step, policy.model, policy.tokenizer, policy.optimizer,
                                   cfg.to_dict(), cfg.keep_last,
                                   hooks_state=hooks.state_dict() if hasattr(hooks, "state_dict") else None)
            t2 = time.monotonic()
            rollout_version = state["version"]
            state.update(path=str(path), version=str(step))
            try:
                await pusher.push(state["path"], state["version"])  # a checkpoint that does not fit: fatal
            except RolloutServerError as exc:  # the next step's resync retries; the checkpoint is safe
                log(f"warning: weight push of step {step} failed ({exc}); will retry before the next step")
                await resync()
            row = {"step": step, "weight_version": state["version"], "rollout_weight_version": rollout_version,
                   **rollout_metrics(rollouts, t0, t1, lambda r: _correct(task, r)),
                   "train_s": t2 - t1, "push_s": time.monotonic() - t2, "train_rollouts": len(batch), **train_stats,
                   **(hooks.step_metrics() if hasattr(hooks, "step_metrics") else {})}
            row |= step_shares(row) | await evaluate(step)
            metrics.log(row, echo=log)
    return row


def score(task, tokenizer, rollouts: list[Rollout]) -> None:
    for r in rollouts:  # decode here: streamed `text` may be a delta
        r.response = tokenizer.decode(r.output_ids, skip_special_tokens=True)
        r.reward = float(task.reward(r.sample, r.response))


def informative(rollouts: list[Rollout]) -> list[Rollout]:
    """The rollouts of groups whose rewards differ: the others have advantage 0 everywhere."""
    rewards: dict[int, set[float]] = {}
    for r in rollouts:
        rewards.setdefault(r.group_id, set()).add(float(r.reward))
    return [r for r in rollouts if len(rewards[r.group_id]) > 1]


def _correct(task, r: Rollout) -> float:
    if hasattr(task, "correct"):
        return float(task.correct(r.sample, r.response))
    return float((r.reward or 0.0) >= 1.0)


def _load_task(cfg: TrainConfig):
    from gleanrl.trainer.tasks import load_task
    return load_task(cfg.data or cfg.task)
