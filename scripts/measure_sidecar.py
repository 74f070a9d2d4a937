"""The sidecar figure (issue 37): `gleanrl harvest` beside an RL loop that is not gleanrl's.

The loop (`scripts/http_rl_loop.py`) speaks only HTTP to `gleanrl serve --harvest-feed`, as slime does;
the sidecar runs pinned to its own core from a random drafter. Per step: the served acceptance from the
responses' `meta_info` (`scripts/sidecar_summary.py`), the drafter versions and the push gate's lines.

    python scripts/measure_sidecar.py --out /tmp/sidecar_fig [--steps 12 --prompts 8 --samples 6]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sidecar_summary import GATE_TAG, acceptance_by_drafter, fmt, gate_statuses, served_acceptance, summarize, table

from gleanrl.bench.serve_process import stop
from gleanrl.trainer.server_proc import free_port

REPO = Path(__file__).resolve().parents[1]
DEFAULT_POLICY = REPO / "gleanrl" / "shipped" / "doubling-small-seed0"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--out", required=True, help="run directory (emptied first)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=8, help="new prompts per step")
    ap.add_argument("--samples", type=int, default=6, help="samples per prompt")
    ap.add_argument("--policy", default=str(DEFAULT_POLICY), help="the policy served and trained")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-5, help="the loop's AdamW learning rate")
    ap.add_argument("--seed", type=int, default=0, help="drafter init seed (prompt seeds are the steps)")
    ap.add_argument("--admin-api-key", default="measure-sidecar")
    ap.add_argument("--server-core", default="0", help="taskset CPU list for the server and the loop")
    ap.add_argument("--harvest-core", default="1", help="taskset CPU list for `gleanrl harvest`")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra `gleanrl serve` flag")
    ap.add_argument("--harvest-arg", action="append", default=[], help="extra `gleanrl harvest` flag")
    tail = "after the last update: wait this long for the sidecar's last row"
    ap.add_argument("--tail-s", type=float, default=15.0, help=tail)
    args = ap.parse_args(argv)
    for name in ("steps", "prompts", "samples", "max_new_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def pinned(cores: str, cmd: list[str]) -> list[str]:
    return ["taskset", "-c", cores, *cmd] if cores and shutil.which("taskset") else cmd


def gleanrl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gleanrl", *args]


def wait_for(pred, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited ({proc.returncode})")
        with contextlib.suppress(Exception):  # not up yet
            if pred():
                return
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not ready after {timeout_s:.0f} s")


class LogTail:
    """New lines of a growing log file since the last read."""

    def __init__(self, path: Path):
        self.path, self.pos = path, 0

    def read(self) -> list[str]:
        if not self.path.exists():
            return []
        with open(self.path, encoding="utf-8", errors="replace") as f:
            f.seek(self.pos)
            text = f.read()
        end = text.rfind("\n") + 1
        self.pos += len(text[:end].encode("utf-8", errors="replace"))
        return text[:end].splitlines()


def run(args: argparse.Namespace) -> dict:
    import httpx
    import torch
    from http_rl_loop import HttpLoop

    from gleanrl.trainer.tasks import load_task

    out = Path(args.out).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if args.server_core:
        os.sched_setaffinity(0, {int(c) for c in args.server_core.split(",")})
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    key = args.admin_api_key
    drafter = out / "drafter_init"
    init = ["--model", args.policy, "--out", str(drafter), "--seed", str(args.seed)]
    subprocess.run(gleanrl_cmd("draft", "init", *init), check=True, env=env)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = ["--model", args.policy, "--drafter", str(drafter), "--sd", "adaptive", "--harvest-feed"]
    serve += ["--admin-api-key", key, "--threads", "1", "--port", str(port), *args.serve_arg]
    serve_cmd = pinned(args.server_core, gleanrl_cmd("serve", *serve))
    side = out / "side"
    metrics = side / "metrics.jsonl"
    rows = lambda: metrics.read_text().splitlines() if metrics.exists() else []  # noqa: E731
    harvest = ["--server", url, "--admin-api-key", key, "--out", str(side), "--drafter", str(drafter)]
    harvest_cmd = pinned(args.harvest_core, gleanrl_cmd("harvest", *harvest, *args.harvest_arg))
    meta = {"args": vars(args), "serve_cmd": serve_cmd, "harvest_cmd": harvest_cmd}
    meta["started"] = time.strftime("%Y-%m-%d %H:%M:%S")
    shown = [" ".join(cmd).replace(key, "K") for cmd in (serve_cmd, harvest_cmd)]
    print("serve:  ", shown[0], "\nharvest:", shown[1], flush=True)
    procs: list[subprocess.Popen] = []
    steps: list[dict] = []
    try:
        server = subprocess.Popen(serve_cmd, stdout=open(out / "server.log", "w"), stderr=subprocess.STDOUT, env=env)
        procs.append(server)
        wait_for(lambda: httpx.get(f"{url}/health", timeout=5).status_code == 200, 300, "gleanrl serve", server)
        harvest_log = out / "harvest.log"
        sidecar = subprocess.Popen(harvest_cmd, stdout=open(harvest_log, "w"), stderr=subprocess.STDOUT, env=env)
        procs.append(sidecar)
        wait_for(lambda: "gleanrl harvest:" in harvest_log.read_text(), 300, "gleanrl harvest", sidecar)
        tail = LogTail(harvest_log)

        task = load_task(None)
        loop = HttpLoop(url, key, args.policy, args.lr, args.max_new_tokens, out, task)
        n = args.prompts * args.samples
        with ThreadPoolExecutor(max_workers=n) as pool:
            for step in range(args.steps):
                t0 = time.monotonic()
                before = loop.get("/model_info").get("draft_weight_version")
                batch, metas = loop.rollouts(task.prompts("train", args.prompts, seed=step), args.samples, pool)
                rewards = [r for *_, r in batch]
                rollout_s = time.monotonic() - t0
                t1 = time.monotonic()
                loss = loop.update(batch, args.samples, step + 1)
                update_s = time.monotonic() - t1
                info = loop.get("/server_info")
                lines = tail.read()
                state = info["internal_states"][0]
                row = {"step": step + 1, "reward": sum(rewards) / len(rewards), "loss": loss, "rollout_s": rollout_s}
                row |= {
                    "update_s": update_s,
                    "max_completion_tokens": max(m.get("completion_tokens", 0) for m in metas),
                }
                row |= {"served": served_acceptance(metas), "by_drafter": acceptance_by_drafter(metas)}
                row["server_avg_spec_accept_length"] = state.get("avg_spec_accept_length")
                # the adaptive SD controller's view: whether it drafts at all
                controller = state.get("sd_controller") or {}
                row["sd_controller"] = {k: controller.get(k) for k in ("eagle_accept", "cells")}
                after = loop.get("/model_info").get("draft_weight_version")
                row |= {"draft_version_before": before, "draft_version_after": after, "gate": gate_statuses(lines)}
                row["sidecar_lines"] = [ln for ln in lines if GATE_TAG not in ln][-20:]
                steps.append(row)
                served, gate = row["served"], row["gate"][-1] if row["gate"] else "(no progress line yet)"
                accept = f"{fmt(served['accept_len'])} (SD {fmt(served['sd_token_share'], '{:.0%}')})"
                print(
                    f"step {row['step']}: reward {row['reward']:.2f}, {served['completion_tokens']} tokens in "
                    f"{rollout_s:.1f} s, accept {accept}, drafter {before}->{row['draft_version_after']} | gate: "
                    f"{gate}",
                    flush=True,
                )
                with open(out / "steps.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
        # the sidecar logs a policy version's row when the next one arrives: one row per step
        # (the last step's rows come with the last update)
        deadline = time.monotonic() + args.tail_s
        while time.monotonic() < deadline and len(rows()) < args.steps:
            time.sleep(1.0)
        if steps:
            steps[-1]["gate"] += [g for g in gate_statuses(tail.read()) if g not in steps[-1]["gate"]]
    finally:
        for proc in reversed(procs):
            stop(proc, timeout_s=120)
    summary = summarize(steps, [json.loads(ln) for ln in rows() if ln.strip()], meta)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    summary = run(args)
    print(table(summary), flush=True)
    print(f"wrote {Path(args.out) / 'summary.json'}", flush=True)
    return summary


if __name__ == "__main__":
    main()
