"""What `gleanrl demo` and `gleanrl bench e2e` run RL with: the embedded servers laid out on the cores,
the demo's GRPO settings, harvest hooks that keep response lengths and a log printing a table line a step."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

from gleanrl.trainer.metrics import format_header, format_row

STEP_COLUMNS = [  # (key, header, width, format), as trainer.metrics.COLUMNS
    ("step", "step", 4, "{:d}"),
    ("reward_mean", "reward", 6, "{:.3f}"),
    ("accuracy", "acc", 5, "{:.2f}"),
    ("eval_accuracy", "held-out", 8, "{:.3f}"),
    ("eval_se", "±se", 5, "{:.3f}"),
    ("response_len_p50", "len50", 5, "{:.0f}"),
    ("response_len_p99", "len99", 5, "{:.0f}"),
    ("rollout_s", "rollout_s", 9, "{:.2f}"),
    ("tail_s", "tail_s", 6, "{:.2f}"),
    ("idle_used_s", "idle_s", 6, "{:.2f}"),
    ("spec_accept_length", "tok/vfy", 7, "{:.2f}"),
    ("drafter_version", "dver", 4, "{}"),
    ("sd_token_share", "sd%", 4, "{:.0%}"),
    ("tokens_per_pass", "tok/pass", 8, "{:.2f}"),
    ("rollout_share", "roll%", 5, "{:.0%}"),
]


def demo_hooks(harvester):
    """HarvestHooks that also keep every step's response lengths (for the histogram)."""
    from gleanrl.harvest.hooks import HarvestHooks

    class DemoHooks(HarvestHooks):
        def __init__(self, h):
            super().__init__(h)
            self.lengths: list[list[int]] = []

        def on_step_start(self, step, model):
            super().on_step_start(step, model)
            self.lengths.append([])

        def on_rollout_finished(self, rollout):
            super().on_rollout_finished(rollout)
            self.lengths[-1].append(len(rollout.output_ids))

    return DemoHooks(harvester)


def table_logger(metrics_path: Path):
    """The trainer's `log`: its warnings pass, and each new metrics row prints as the demo's table line."""
    # rows already there (a resumed run's) were printed by an earlier logger
    seen, header = [len(metrics_path.read_text().splitlines()) if metrics_path.exists() else 0], [True]

    def log(*parts) -> None:
        msg = " ".join(str(p) for p in parts)
        if msg.startswith(("warning", "resuming", "scheduling check", "drafter gate")):
            print(msg, flush=True)
        rows = metrics_path.read_text().splitlines() if metrics_path.exists() else []
        for line in rows[seen[0] :]:
            if header[0]:
                header[0] = False
                print(format_header(STEP_COLUMNS))
            print(format_row(json.loads(line), STEP_COLUMNS), flush=True)
            seen[0] += 1

    return log


@contextlib.contextmanager
def serving(
    policy: Path,
    drafter: Path | None,
    log_path: Path,
    sd: str = "adaptive",
    dtype: str = "auto",
    device: str = "cpu",
    replicas: int = 0,
    backend: dict | None = None,
    harvests: bool = True,
):
    """The embedded rollout servers laid out by `replicas` (`trainer.layout.layout_groups`), started and
    healthy; `backend` replaces the SD settings (e.g. {"backend": "sglang"})."""
    from gleanrl.trainer.layout import Replicas, layout_groups
    from gleanrl.trainer.phases import all_cores

    if backend is None:
        backend = ({"drafter": str(drafter)} if drafter else {}) | {"sd": sd if drafter else "off"}
    extra = {**backend, "dtype": dtype, "device": device}
    groups = layout_groups(replicas, extra, harvests) if replicas != 1 else [all_cores()]
    servers = Replicas(str(policy), groups, extra, log_path=log_path)
    try:
        servers.start()
        for server in servers.servers:
            wait_healthy(server)
        yield servers
    finally:
        servers.stop()


def rl_config(policy: Path, out: Path, args: argparse.Namespace, seed: int, evaluate: bool = False):
    """The demo's GRPO settings (its servers are handed to `train` apart); `evaluate`: held-out accuracy
    at T = 1 on fixed prompts (the demo's evidence that RL helps; the e2e bench times steps alone)."""
    from gleanrl.trainer.config import TrainConfig

    names = ["steps", "prompts_per_step", "samples_per_prompt", "max_new_tokens", "lr", "negative_weight"]
    names += ["update_dtype"] + (["eval_every", "eval_prompts", "eval_samples"] if evaluate else [])
    evals = {"eval_temperature": 1.0} if evaluate else {}
    return TrainConfig(model=str(policy), out=str(out), seed=seed, **{k: getattr(args, k) for k in names}, **evals)


def wait_healthy(server, timeout_s: float = 180.0) -> None:
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.alive():
            raise SystemExit(f"gleanrl: the rollout server exited:\n{server.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise SystemExit(f"gleanrl: the rollout server did not become healthy in {timeout_s:.0f} s")
