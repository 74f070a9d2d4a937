"""The RL loop: GRPO against a long-lived rollout server over SGLang's native HTTP API.

    for step in steps:
        prompts  = task.prompts("train", n, seed=step)
        rollouts = generate n samples per prompt concurrently (consumed as each finishes: harvest hook)
        rewards  = task.reward(...) ; advantages = group-normalised (GRPO)
        policy   = one AdamW step on the PPO-clipped loss with ratio vs the rollout logprobs (+ k3 KL)
        save weight_v{step} atomically ; push it with update_weights_from_disk(weight_version=step)

Simplified relative to the literature (DeepSeekMath GRPO, DAPO, slime) and why:
- One policy update per step (no PPO epochs over minibatches): the rollouts are exactly on-policy,
  so the importance ratio only absorbs the numerical mismatch between the server and the trainer
  (which we report as `logprob_mismatch`); clipping stays as the safety net it is in slime.
- The old-policy logprobs are the server's rollout logprobs, not a trainer recomputation: saves a
  forward pass and makes engine bugs visible in the mismatch metric instead of hiding them.
- Token-level normalisation (DAPO) over the step's informative groups: a group whose rewards are all
  equal has advantage 0, so without KL it is left out of the update (DAPO's dynamic-sampling filter,
  without its re-sampling); it would only cost a forward/backward and dilute the normalisation. A
  step with no informative group runs the optimizer on zero gradients (AdamW's momentum moves the
  weights exactly as an update on all-zero advantages would) without any forward or backward. No
  length penalty; KL to the initial policy off by default (rule-based rewards need no
  reward-model guard).
- `negative_weight` < 1 scales down negative advantages (PSR); the demo keeps it at 1, plain GRPO.
  Over a group the advantages then sum to zero, so the tokens its successes and failures share
  cancel and the update is their difference; at < 1 every success's tokens are pushed up on top of
  it. On the demo's small SFT policy what decides first is the step size: at lr 2e-4 (Adam moves
  every weight by about lr a step, whatever the gradient's noise) 12 steps made it worse in 4 of 5
  runs; at lr 1e-4 with 16 prompts x 4 samples a step, plain GRPO raised held-out T=1 accuracy on
  each of 5 seeds (docs/rl-gain.md, issue 23).
- Synchronous: step N+1's rollouts start after the push of step N's weights, so every rollout is
  sampled by exactly the version the trainer holds; the long tail is what the harvester gleans. The
  phases never overlap, so the update may take every core while the server waits (`update_threads`,
  `update_cores`: `trainer.phases`), and its forward hands the harvester the hidden states of the
  rollouts it trains on (`hooks.update_capture()`), instead of a second pass in the idle window.
- Weight sync from the checkpoint written each step (`trainer.policy_push`, `clients.weight_sync`):
  checked against the serving model first, then `update_weights_from_disk`, or a
  `selector: "target"` tensor session for stock SGLang running EAGLE-3; no NCCL broadcast.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import torch

from gleanrl.clients.rollout import Rollout
from gleanrl.clients.rollout_client import RolloutClient
from gleanrl.clients.transport import RolloutServerError
from gleanrl.clients.weight_sync import DrafterPush
from gleanrl.trainer.checkpoint import list_checkpoints, load_latest, save_checkpoint
from gleanrl.trainer.config import TrainConfig, write_resolved
from gleanrl.trainer.generate import make_rollouts, run_step, sampling_params
from gleanrl.trainer.hooks import NoHooks, RolloutHooks, missing_hooks
from gleanrl.trainer.layout import IdleCores, Replicas, layout_groups
from gleanrl.trainer.metrics import MetricsLog, eval_metrics, rollout_metrics, step_shares
from gleanrl.trainer.phases import all_cores, phase_threads
from gleanrl.trainer.policy import Policy
from gleanrl.trainer.policy_push import PolicyPusher
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
    """Run `cfg.steps` GRPO steps (continuing from the last checkpoint with `resume`). Returns the
    last step's metrics row. `hooks` default: a Harvester's (`harvest.hooks.HarvestHooks`) with
    `cfg.drafter`, else none. Rollout servers: `cfg.servers`, else `replicas` (started and stopped
    by the caller, e.g. the demo, which serves from them afterwards), else embedded replicas laid
    out by `cfg.replicas` (`trainer.layout`), started here."""
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
    own = (
        None
        if cfg.servers or replicas
        else Replicas(
            cfg.model,
            layout_groups(cfg.replicas, cfg.serve, hooks.harvests),
            cfg.serve,
            cfg.api_key,
            cfg.admin_api_key,
            f"{cfg.out}/server.log",
            sd=sd,
            threads=cfg.server_threads or None,
        )
    )
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


class Run:
    """What one `train()` holds: the servers' client (and the embedded replicas, if any), the policy
    and the weights the servers must serve (`path`, `version`), the metrics log. Its methods are
    the loop's steps."""

    def __init__(
        self,
        cfg: TrainConfig,
        task: Task,
        policy: Policy,
        hooks: RolloutHooks,
        servers: Replicas | None,
        weights: tuple[str, str],
        log=print,
    ):
        self.cfg, self.task, self.policy, self.hooks = cfg, task, policy, hooks
        self.servers, self.log = servers, log
        self.client = RolloutClient(
            cfg.servers or servers.urls, cfg.api_key, cfg.admin_api_key, cfg.request_timeout_s, router=cfg.router
        )
        self.pusher = PolicyPusher(self.client, cfg.model)
        start = int(weights[1])
        self.metrics = MetricsLog(cfg.out, resume_step=start or None, harvest=hooks.harvests)
        self.path, self.version = weights

    async def resync(self, attempts: int = 3) -> None:
        """Wait for the server(s) (restarting embedded ones that died), then make them serve
        our weights."""
        server = self.servers
        for attempt in range(attempts):
            if server:  # a kill may land between this check and the health poll: hence the attempts
                server.ensure_running()
            try:
                alive = server.alive if server else None
                await self.client.wait_healthy(self.cfg.server_wait_s, alive=alive)
                break
            except RolloutServerError as exc:
                if server and attempt + 1 < attempts and not server.alive():
                    continue
                if server:  # the embedded server's own words say why
                    exc.message += f"; the end of its log:\n{server.log_tail()}"
                    exc.args = (f"{exc.url}: {exc.message}",)
                raise
        await self.pusher.push(self.path, self.version)

    async def check_scheduling(self) -> dict:
        """The server's decode alone and beside the harvester's compute (trainer.sched_check)."""
        from gleanrl.trainer.sched_check import check_scheduling

        prompt = make_rollouts(self.cfg, self.task, self.policy.tokenizer, 1)[0].prompt_ids
        return await check_scheduling(self.client, prompt, self.hooks.scheduling_probe, self.log)

    async def generate(
        self,
        rollouts: list[Rollout],
        params: dict,
        hooks: RolloutHooks,
        stream: bool | None = None,
        desc: str = "rollouts",
    ) -> None:
        cfg = self.cfg
        await run_step(
            self.client,
            rollouts,
            params,
            expected_version=self.version,
            resync=self.resync,
            hooks=hooks,
            max_attempts=cfg.max_attempts,
            stream=cfg.stream if stream is None else stream,
            stream_interval=cfg.stream_interval,
            log=self.log,
            desc=desc,
        )

    def update(self, batch: list[Rollout]) -> dict:
        """One policy update; micro-batches of similar lengths pad far less (the loss does not
        depend on the order)."""
        cfg = self.cfg
        ordered = sorted(batch, key=lambda r: len(r.prompt_ids) + len(r.output_ids))
        with (
            phase_threads(cfg.update_threads or len(all_cores()), cfg.update_cores),
            self.hooks.update_capture() as cap,
        ):
            return self.policy.train_step(ordered, capture=cap)

    def checkpoint(self, step: int) -> None:
        """Save step `step` atomically; from now on it is what the servers must serve."""
        cfg, policy = self.cfg, self.policy
        path = save_checkpoint(
            cfg.out,
            step,
            policy.model,
            policy.tokenizer,
            policy.optimizer,
            cfg.to_dict(),
            cfg.keep_last,
            hooks_state=self.hooks.state_dict(),
        )
        self.path, self.version = str(path), str(step)

    async def push(self) -> None:
        try:
            await self.pusher.push(self.path, self.version)  # a checkpoint that does not fit: fatal
        except RolloutServerError as exc:  # the next step's resync retries; the checkpoint is safe
            self.log(f"warning: weight push of step {self.version} failed ({exc}); will retry before the next step")
            await self.resync()

    async def evaluate(self, step: int) -> dict:
        """Held-out accuracy: the same prompts and seeds every time (paired evals)."""
        cfg = self.cfg
        if not cfg.eval_every or (step % cfg.eval_every and step != cfg.steps):
            return {}
        t0, row = time.monotonic(), {}
        passes = [("eval", cfg.eval_temperature, cfg.eval_samples)]
        if cfg.eval_greedy and cfg.eval_temperature > 0:
            passes.append(("eval_greedy", 0.0, 1))
        for prefix, temperature, samples in passes:
            rollouts = make_rollouts(
                cfg, self.task, self.policy.tokenizer, 0, split="test", n=cfg.eval_prompts, samples=samples
            )
            params = dict(sampling_params(cfg), temperature=temperature)
            await self.generate(rollouts, params, NoHooks(), stream=False, desc=prefix)
            score(self.task, self.policy.tokenizer, rollouts)
            stats = eval_metrics(rollouts, self.correct, self.metrics.first(f"{prefix}_scores"))
            row |= {prefix + k[len("eval") :]: v for k, v in stats.items()}
        return row | {"eval_temperature": cfg.eval_temperature, "eval_s": time.monotonic() - t0}

    def correct(self, r: Rollout) -> float:
        return float(self.task.correct(r.sample, r.response, r.reward or 0.0))


def score(task: Task, tokenizer, rollouts: list[Rollout]) -> None:
    for r in rollouts:  # decode here: streamed `text` may be a delta
        r.response = tokenizer.decode(r.output_ids, skip_special_tokens=True)
        r.reward = float(task.reward(r.sample, r.response))


def informative(rollouts: list[Rollout]) -> list[Rollout]:
    """The rollouts of groups whose rewards differ: the others have advantage 0 everywhere."""
    rewards: dict[int, set[float]] = {}
    for r in rollouts:
        rewards.setdefault(r.group_id, set()).add(float(r.reward))
    return [r for r in rollouts if len(rewards[r.group_id]) > 1]


def _load_task(cfg: TrainConfig) -> Task:
    from gleanrl.trainer.tasks import load_task

    return load_task(cfg.data or cfg.task)
