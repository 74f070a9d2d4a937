"""What the demo and the benches start from: the regime's step shape, the policy, its warm-start drafter
(cached; the shipped one where the settings match), the fastest CPU dtype and a fresh output folder."""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path


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
