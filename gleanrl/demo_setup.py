"""What the demo and the benches start from: the regime's step shape, the policy, its warm-start drafter
(cached; the shipped one where the settings match), the fastest CPU dtype and a fresh output folder; and what
`gleanrl demo` and `gleanrl bench e2e` run RL with: the embedded servers laid out on the cores, the demo's GRPO
settings, harvest hooks that keep response lengths and a log printing a table line a step."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import shutil
from pathlib import Path

from gleanrl.trainer.metrics import format_header, format_row


def apply_regime(args: argparse.Namespace):
    """Fill the step's shape from `args.regime` (default: the size's) where no flag gave it; -> its task."""
    from gleanrl.shipped import SHIPPED
    from gleanrl.trainer.tasks import load_task
    from gleanrl.trainer.tasks.presets import DEMO_REGIME, regime

    if args.regime is None:
        args.regime = entry.regime if (entry := SHIPPED.get(args.size)) else DEMO_REGIME
    r = regime(args.regime)
    for name in ("max_new_tokens", "prompts_per_step", "samples_per_prompt"):
        if getattr(args, name, None) is None:
            setattr(args, name, getattr(r, name))
    return load_task(r.task)


def warm_settings(args: argparse.Namespace, task: str | None = None) -> dict:
    """What a warm start depends on besides the policy (the shipped drafter records it)."""
    from gleanrl.trainer.tasks.presets import regime

    settings = {"task": task or regime(args.regime).task, "prompts": args.warm_prompts, "steps": args.warm_steps}
    return settings | {"max_new_tokens": args.max_new_tokens, "seed": args.seed}


def policy_of(args: argparse.Namespace) -> Path:
    """--model, else the shipped policy (checked), else with --from-scratch a bootstrap (cached)."""
    from gleanrl.shipped import SHIPPED, shipped_policy
    from gleanrl.trainer.bootstrap import bootstrap_policy

    if args.model:
        return Path(args.model)
    entry = SHIPPED.get(args.size)
    if args.from_scratch:
        return bootstrap_policy(size=args.size, seed=args.seed, task=entry.task if entry else None)
    if entry is None:
        shipped = f"shipped: {sorted(SHIPPED)}"
        raise ValueError(f"no policy of size {args.size!r} is shipped ({shipped}): add --from-scratch to bootstrap it")
    return shipped_policy(size=args.size)


def warm_drafter(policy: Path, args: argparse.Namespace, task: str | None = None) -> Path:
    """A drafter warm-started on the policy's own generations for `task`'s prompts (default: the regime's),
    cached by policy, task and settings; the shipped one for the shipped policy and its settings."""
    from gleanrl.draft_train import WarmStartConfig, warm_start
    from gleanrl.harvest.checkpoint import save_drafter
    from gleanrl.shipped import shipped_drafter, shipped_for
    from gleanrl.trainer.bootstrap import cache_root
    from gleanrl.trainer.tasks import load_task
    from gleanrl.trainer.tasks.presets import regime

    if entry := shipped_for(policy):  # a shipped policy: its drafter, if made with these settings
        made = entry.drafter / "warm_start.json"
        if made.is_file() and json.loads(made.read_text()) == warm_settings(args, task):
            return shipped_drafter(entry.size)
    task = task or regime(args.regime).task
    weights = sorted(policy.glob("*.safetensors"))
    ident = [str(policy.resolve())] + [f"{w.name}:{w.stat().st_size}:{w.stat().st_mtime_ns}" for w in weights]
    cfg = WarmStartConfig(max_new_tokens=args.max_new_tokens, steps=args.warm_steps, seed=args.seed)
    key = hashlib.sha256(json.dumps([ident, task, args.warm_prompts, repr(cfg)]).encode()).hexdigest()[:12]
    out = cache_root() / "drafters" / f"{policy.name}-{key}"
    if not (out / "config.json").exists():
        prompts = [s["prompt"] for s in load_task(task).prompts("warm", args.warm_prompts, args.seed)]
        drafter, history = warm_start(policy, prompts, cfg)
        save_drafter(drafter, out)
        accept = f"{history[0]['accept_length']:.2f} -> {history[-1]['accept_length']:.2f}"
        print(f"warm-started drafter ({task}): held-out acceptance {accept}")
    return out


def fresh_out(out: Path, marker: str, args: argparse.Namespace, subs: tuple[str, ...]) -> bool:
    """Make `out` ready for a new run; False if it holds something that is not ours."""
    if out.exists() and any(out.iterdir()) and not (out / marker).exists():
        return False
    for sub in subs:
        shutil.rmtree(out / sub, ignore_errors=True) if (out / sub).is_dir() else (out / sub).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / marker).write_text(json.dumps({k: v for k, v in vars(args).items() if not k.startswith("_")}))
    return True


def fastest_cpu_dtype(dtype: str) -> str:
    """The demo's and the benches' `auto`: bfloat16 where the CPU multiplies bf16 natively, else float32."""
    from gleanrl.harvest.train_step import bf16_fast

    if dtype != "auto":
        return dtype
    return "bfloat16" if bf16_fast("cpu") else "float32"


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
    names += ["update_dtype"] + (["eval_every", "eval_samples"] if evaluate else [])
    evals = {"eval_temperature": 1.0} if evaluate else {}
    if evaluate and args.eval_every and not args.eval_prompts:
        raise ValueError("--eval-every needs held-out prompts: --eval-prompts must be >= 1")
    if evaluate and args.eval_prompts:  # 0: no held-out figure at all (the sampled one is off too)
        evals["eval_prompts"] = args.eval_prompts
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
