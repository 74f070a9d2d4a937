"""What one `train()` holds (`Run`): the servers' client (and embedded replicas, if any), the policy, the weights the
servers must serve, the metrics log; its methods are the RL loop's steps. `score` rewards rollouts.

`PolicyPusher` checks each checkpoint against each server's serving model (its `/model_info` directory where
readable here, else the initial `--model`) before anything is sent, as stock SGLang applies what it is given (a
truncated file kills it, another architecture's weights load as success); then the route safe for the server's kind.

`check_scheduling`, at start-up: the server's decode alone and beside the harvester's kind of compute. On CPU, an
OpenMP team waits at each kernel's barrier for its slowest worker, so a harvester thread on one of its cores slows the
whole forward; and under autogroup scheduling `nice` ranks threads only within a session, so a nice-19 harvester in
another session competes at full weight (2 cores: a forward at 8 running 15 -> 130 ms). Hence the trainer starts its
server in its own session (`trainer.server_proc`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from gleanrl.clients.rollout import Rollout
from gleanrl.clients.rollout_client import RolloutClient
from gleanrl.clients.transport import RolloutServerError
from gleanrl.clients.weight_sync import Route, probe_all, push_policy
from gleanrl.harvest.checkpoint_check import CheckpointMismatch, check_policy_checkpoint
from gleanrl.trainer.checkpoint import save_checkpoint
from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.generate import make_rollouts, run_step, sampling_params
from gleanrl.trainer.hooks import NoHooks, RolloutHooks
from gleanrl.trainer.layout import Replicas
from gleanrl.trainer.metrics import MetricsLog, eval_metrics
from gleanrl.trainer.phases import all_cores, phase_threads
from gleanrl.trainer.policy import Policy
from gleanrl.trainer.tasks.base import Task

SLOWDOWN_WARN = 1.10  # the scheduling check's slowdown above which the log warns


class Run:
    """What one `train()` holds (the module's docstring); `path`, `version`: the weights the servers must serve."""

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
        urls = cfg.servers or servers.urls
        self.client = RolloutClient(urls, cfg.api_key, cfg.admin_api_key, cfg.request_timeout_s, router=cfg.router)
        self.pusher = PolicyPusher(self.client, cfg.model)
        start = int(weights[1])
        self.metrics = MetricsLog(cfg.out, resume_step=start or None, harvest=hooks.harvests)
        self.path, self.version = weights

    async def resync(self, attempts: int = 3) -> None:
        """Wait for the server(s) (restarting embedded ones that died), then make them serve our weights."""
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
        """The server's decode alone and beside the harvester's compute (`check_scheduling`)."""
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
        stream = self.cfg.stream if stream is None else stream
        await run_step(
            self.client, rollouts, params, self.cfg, self.version, self.resync, hooks, stream, self.log, desc
        )

    def update(self, batch: list[Rollout]) -> dict:
        """One policy update; sorted, micro-batches of similar lengths pad far less (the loss ignores order)."""
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
        state = self.hooks.state_dict()
        args = (cfg.out, step, policy.model, policy.tokenizer, policy.optimizer, cfg.to_dict(), cfg.keep_last)
        path = save_checkpoint(*args, hooks_state=state)
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
            tok = self.policy.tokenizer
            rollouts = make_rollouts(cfg, self.task, tok, 0, split="test", n=cfg.eval_prompts, samples=samples)
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


def serving_reference(model_path: str | None, fallback: str | Path) -> Path:
    """The serving model's directory if readable here (same host or shared volume), else `fallback`."""
    if model_path and (Path(model_path) / "config.json").is_file():
        return Path(model_path)
    return Path(fallback)


class PolicyPusher:
    def __init__(self, client: RolloutClient, initial_model: str | Path):
        self.client, self.initial_model = client, Path(initial_model)
        self.routes: dict[str, Route] = {}  # the last push's route per worker URL (for logs and tests)

    async def push(self, path: str, version: str) -> None:
        """Raises CheckpointMismatch (nothing sent) or RolloutServerError."""
        kinds = await probe_all(self.client)
        for kind in kinds:
            try:
                check_policy_checkpoint(path, serving_reference(kind.model_path, self.initial_model))
            except CheckpointMismatch as exc:
                raise CheckpointMismatch(f"refusing to push the policy to {kind.url}: {exc}") from None
        self.routes = await push_policy(self.client, path, version, kinds)


async def _decode_s(client: RolloutClient, prompt_ids: list[int], running: int, tokens: int) -> float:
    """Wall seconds of `running` concurrent greedy requests of `tokens` tokens each."""
    params = {"max_new_tokens": tokens, "temperature": 0.0, "ignore_eos": True}
    t0 = time.perf_counter()
    await asyncio.gather(*(client.generate(prompt_ids, params) for _ in range(running)))
    return time.perf_counter() - t0


async def check_scheduling(
    client: RolloutClient,
    prompt_ids: list[int],
    probe: Callable[[], AbstractContextManager],
    log=print,
    running: int = 4,
    tokens: int = 48,
    repeats: int = 2,
) -> dict:
    """The best of `repeats` timings alone and beside `probe()`, logged; -> figures for the metrics."""
    await _decode_s(client, prompt_ids, running, 4)  # warm-up
    alone = min([await _decode_s(client, prompt_ids, running, tokens) for _ in range(repeats)])
    with probe():
        beside = min([await _decode_s(client, prompt_ids, running, tokens) for _ in range(repeats)])
    ratio = beside / alone
    verdict = "ok" if ratio <= SLOWDOWN_WARN else "WARNING: the harvester slows the rollouts"
    if ratio > SLOWDOWN_WARN:
        verdict += (
            f" (autogroup {_autogroup()}: a server in another session competes at full weight, start it in this one;"
            " one in this session still shares cores and memory bandwidth, give the harvester cores of its own)"
        )
    timing = f"{alone * 1e3:.0f} ms alone, {beside * 1e3:.0f} ms beside the harvester's compute ({ratio:.2f}x)"
    log(f"scheduling check: {running} x {tokens} tokens decode in {timing}: {verdict}")
    return {"sched_alone_s": alone, "sched_beside_s": beside, "sched_slowdown": ratio}


def _autogroup(
    enabled_file: str = "/proc/sys/kernel/sched_autogroup_enabled", group_file: str = "/proc/self/autogroup"
) -> str:
    """'on, this process in /autogroup-N', 'off' or 'unknown' (a container may hide or blank either file)."""
    try:
        enabled = Path(enabled_file).read_text().strip()
        group = Path(group_file).read_text().split()
    except OSError:
        return "unknown"
    if enabled == "0":
        return "off"
    return f"on, this process in {group[0]}" if enabled == "1" and group else "unknown"
