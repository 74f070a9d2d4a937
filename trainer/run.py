"""What one `train()` holds (`Run`): the servers' client (and embedded replicas, if any), the policy, the weights the
servers must serve, the metrics log; its methods are the RL loop's steps. `score` rewards rollouts.
"""

from __future__ import annotations

import time

from gleanrl.clients.rollout import Rollout
from gleanrl.clients.rollout_client import RolloutClient
from gleanrl.clients.transport import RolloutServerError
from gleanrl.trainer.checkpoint import save_checkpoint
from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.generate import make_rollouts, run_step, sampling_params
from gleanrl.trainer.hooks import NoHooks, RolloutHooks
from gleanrl.trainer.layout import Replicas
from gleanrl.trainer.metrics import MetricsLog, eval_metrics
from gleanrl.trainer.phases import all_cores, phase_threads
from gleanrl.trainer.policy import Policy
from gleanrl.trainer.policy_push import PolicyPusher
from gleanrl.trainer.tasks.base import Task


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
