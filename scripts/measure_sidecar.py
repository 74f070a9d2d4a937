"""The sidecar figure (issue 37): `gleanrl harvest` beside an RL loop that is not gleanrl's.

The loop speaks only HTTP to its rollout server, as slime does: `POST /generate` with `input_ids`,
`sampling_params` (T=1) and `return_logprob`, one request per sample; then a REINFORCE step of its
own on its own copy of the policy (group-mean baseline, token-mean log-probability), saved atomically
with `save_pretrained` and pushed as pause -> flush -> `POST /update_weights_from_disk` with a
`weight_version` -> continue (`scripts/http_rl_loop.py`). Each step draws NEW prompts of the built-in task
(`load_task(None).prompts("train", P, seed=step)`) x S samples. Beside it:

    taskset -c 0 gleanrl serve --model POLICY --drafter DRAFTER_INIT --sd adaptive --harvest-feed \\
        --admin-api-key K --threads 1
    taskset -c 1 gleanrl harvest --server URL --admin-api-key K --out OUT/side --drafter DRAFTER_INIT

with DRAFTER_INIT a random drafter from `gleanrl draft init`. The loop runs on the server's core
(its update runs while the server waits, as a colocated trainer's would).

Per step it records the served acceptance from the responses' SGLang `meta_info` (tokens per verify
pass over the SD passes: (spec_accept_token_num + spec_verify_ct) / spec_verify_ct; also SGLang's
completion_tokens / spec_verify_ct and the share of tokens SD decoded), the same split by the
`draft_weight_version` each response reports, `/server_info`'s cumulative `avg_spec_accept_length`,
`/model_info`'s `draft_weight_version` before and after the step, and the sidecar's log lines about
the push gate (its progress line's last field: why it pushed or held). At the end, the sidecar's
per-policy-version metrics rows (OUT/side/metrics.jsonl) give each push's measured paired gain.

    python scripts/measure_sidecar.py --out /tmp/sidecar_fig [--steps 12 --prompts 8 --samples 6]

Writes OUT/summary.json and prints a table (`scripts/sidecar_summary.py`).
`--harvest-arg=--push-every=10` etc. pass settings on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sidecar_summary import GATE_TAG, acceptance_by_drafter, fmt, gate_statuses, served_acceptance, summarize, table

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
    ap.add_argument(
        "--tail-s", type=float, default=15.0, help="after the last update: wait this long for the sidecar's last row"
    )
    args = ap.parse_args(argv)
    for name in ("steps", "prompts", "samples", "max_new_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


# ---- the run --------------------------------------------------------------------------------


def pinned(cores: str, cmd: list[str]) -> list[str]:
    return ["taskset", "-c", cores, *cmd] if cores and shutil.which("taskset") else cmd


def gleanrl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gleanrl", *args]


def wait_for(pred, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited ({proc.returncode})")
        try:
            if pred():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
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
    subprocess.run(
        gleanrl_cmd("draft", "init", "--model", args.policy, "--out", str(drafter), "--seed", str(args.seed)),
        check=True,
        env=env,
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve_cmd = pinned(
        args.server_core,
        gleanrl_cmd(
            "serve",
            "--model",
            args.policy,
            "--drafter",
            str(drafter),
            "--sd",
            "adaptive",
            "--harvest-feed",
            "--admin-api-key",
            key,
            "--threads",
            "1",
            "--port",
            str(port),
            *args.serve_arg,
        ),
    )
    side = out / "side"
    harvest_cmd = pinned(
        args.harvest_core,
        gleanrl_cmd(
            "harvest",
            "--server",
            url,
            "--admin-api-key",
            key,
            "--out",
            str(side),
            "--drafter",
            str(drafter),
            *args.harvest_arg,
        ),
    )
    meta = {
        "args": vars(args),
        "serve_cmd": serve_cmd,
        "harvest_cmd": harvest_cmd,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(
        "serve:  ",
        " ".join(serve_cmd).replace(key, "K"),
        "\nharvest:",
        " ".join(harvest_cmd).replace(key, "K"),
        flush=True,
    )
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
                row = {
                    "step": step + 1,
                    "reward": sum(rewards) / len(rewards),
                    "loss": loss,
                    "rollout_s": rollout_s,
                    "update_s": update_s,
                    "max_completion_tokens": max(m.get("completion_tokens", 0) for m in metas),
                    "served": served_acceptance(metas),
                    "by_drafter": acceptance_by_drafter(metas),
                    "server_avg_spec_accept_length": info["internal_states"][0].get("avg_spec_accept_length"),
                    # the adaptive SD controller's view: whether it drafts at all
                    "sd_controller": {
                        k: (info["internal_states"][0].get("sd_controller") or {}).get(k)
                        for k in ("eagle_accept", "cells")
                    },
                    "draft_version_before": before,
                    "draft_version_after": loop.get("/model_info").get("draft_weight_version"),
                    "gate": gate_statuses(lines),
                    "sidecar_lines": [ln for ln in lines if GATE_TAG not in ln][-20:],
                }
                steps.append(row)
                print(
                    f"step {row['step']}: reward {row['reward']:.2f}, "
                    f"{row['served']['completion_tokens']} tokens in {rollout_s:.1f} s, "
                    f"accept {fmt(row['served']['accept_len'])} "
                    f"(SD {fmt(row['served']['sd_token_share'], '{:.0%}')}), drafter "
                    f"{before}->{row['draft_version_after']} | gate: "
                    f"{row['gate'][-1] if row['gate'] else '(no progress line yet)'}",
                    flush=True,
                )
                with open(out / "steps.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
        # the sidecar logs a policy version's row when the next one arrives: one row per step
        # (the last step's rows come with the last update)
        metrics = side / "metrics.jsonl"
        deadline = time.monotonic() + args.tail_s
        while time.monotonic() < deadline and (
            not metrics.exists() or len(metrics.read_text().splitlines()) < args.steps
        ):
            time.sleep(1.0)
        if steps:
            steps[-1]["gate"] += [g for g in gate_statuses(tail.read()) if g not in steps[-1]["gate"]]
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    rows = (
        [json.loads(ln) for ln in (side / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        if (side / "metrics.jsonl").exists()
        else []
    )
    summary = summarize(steps, rows, meta)
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
