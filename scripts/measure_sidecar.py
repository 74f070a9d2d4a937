"""The sidecar figure (issue 37): `gleanrl harvest` beside an RL loop that is not gleanrl's.

The loop speaks only HTTP to its rollout server, as slime does: `POST /generate` with `input_ids`,
`sampling_params` (T=1) and `return_logprob`, one request per sample; then a REINFORCE step of its
own on its own copy of the policy (group-mean baseline, token-mean log-probability), saved atomically
with `save_pretrained` and pushed as pause -> flush -> `POST /update_weights_from_disk` with a
`weight_version` -> continue. Each step draws NEW prompts of the built-in task
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

Writes OUT/summary.json and prints a table. `--harvest-arg=--push-every=10` etc. pass settings on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_POLICY = REPO / "gleanrl" / "shipped" / "doubling-small-seed0"
GATE_TAG = "[harvest]"


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


# ---- pure functions (tests/test_measure_sidecar.py) -------------------------------------------


def served_acceptance(metas: list[dict]) -> dict:
    """Pooled SD figures over responses' `meta_info`: `accept_len` tokens per verify pass over the
    SD passes (None without any), `sglang_accept_len` SGLang's completion tokens / verify passes
    (plain-decoded tokens included), `sd_token_share` the share of tokens emitted by verify passes."""
    verify = sum(m.get("spec_verify_ct") or 0 for m in metas)
    accepted = sum(m.get("spec_accept_token_num") or 0 for m in metas)
    tokens = sum(m.get("completion_tokens") or 0 for m in metas)
    return {
        "accept_len": (verify + accepted) / verify if verify else None,
        "sglang_accept_len": tokens / verify if verify else None,
        "sd_token_share": (verify + accepted) / tokens if tokens else None,
        "verify_passes": verify,
        "completion_tokens": tokens,
    }


def acceptance_by_drafter(metas: list[dict]) -> dict[str, dict]:
    """`served_acceptance` per the `draft_weight_version` each response reports."""
    groups: dict[str, list[dict]] = {}
    for m in metas:
        groups.setdefault(str(m.get("draft_weight_version")), []).append(m)
    return {v: served_acceptance(ms) for v, ms in sorted(groups.items())}


def gate_statuses(lines: list[str]) -> list[str]:
    """The distinct gate words (the progress line's last field) in the order first seen, and every
    refused push."""
    seen: list[str] = []
    for line in lines:
        if GATE_TAG in line and " | " in line:
            why = line.rsplit(" | ", 1)[1].strip()
        elif "push refused" in line:
            why = line.strip()
        else:
            continue
        if why not in seen:
            seen.append(why)
    return seen


def pushes_from_metrics(rows: list[dict]) -> list[dict]:
    """Each push the sidecar's metrics rows record: the policy version it happened under, the
    drafter version it made, its paired gain and the gain's lower bound (tokens per verify pass)."""
    out, version = [], None
    for row in rows:
        gains = row.get("push_gains") or []
        end = row.get("drafter_version")
        first = (end - len(gains) + 1) if isinstance(end, int) else None
        for i, (gain, lower) in enumerate(gains):
            out.append(
                {
                    "sidecar_step": row.get("step"),
                    "weight_version": row.get("weight_version"),
                    "drafter_version": first + i if first is not None else None,
                    "gain": gain,
                    "gain_lower": lower,
                }
            )
        version = end if end is not None else version
    return out


def mean_accept(steps: list[dict]) -> float | None:
    """Pooled tokens per verify pass over several steps."""
    verify = sum(s["served"]["verify_passes"] for s in steps)
    if not verify:
        return None
    return (
        sum(s["served"]["accept_len"] * s["served"]["verify_passes"] for s in steps if s["served"]["verify_passes"])
        / verify
    )


SIDECAR_KEYS = (
    "weight_version",
    "harvested",
    "drafter_steps",
    "drafter_version",
    "drafter_pushes",
    "drafter_push_attempts",
    "push_why",
    "push_gains",
    "heldout_accept_len",
    "candidate_accept_len",
    "served_accept_len",
    "idle_used_s",
    "cpu_share",
)


def sidecar_row_for(step: int, rows: list[dict]) -> dict | None:
    """The sidecar's row for the policy version that served `step` (1-based): the initial
    version for step 1, the loop's `weight_version` step - 1 after."""
    full = [r for r in rows if not r.get("partial")]
    if step == 1:
        return full[0] if full else None
    return next((r for r in full if str(r.get("weight_version")) == str(step - 1)), None)


def summarize(steps: list[dict], sidecar_rows: list[dict], meta: dict) -> dict:
    pushes = pushes_from_metrics(sidecar_rows)
    for s in steps:
        row = sidecar_row_for(s["step"], sidecar_rows)
        s["sidecar"] = {k: row.get(k) for k in SIDECAR_KEYS} if row else None
    k = 2 if len(steps) >= 4 else 1
    first, last = mean_accept(steps[:k]), mean_accept(steps[-k:])
    return {
        **meta,
        "steps": steps,
        "sidecar_rows": sidecar_rows,
        "pushes": pushes,
        "n_pushes": len(pushes),
        "served_accept": {
            "first": first,
            "last": last,
            "over_steps": k,
            "ratio": last / first if first and last else None,
        },
        "draft_weight_version_final": steps[-1]["draft_version_after"] if steps else None,
    }


def fmt(x, spec: str = "{:.2f}") -> str:
    return "-" if x is None else spec.format(x)


def table(summary: dict) -> str:
    lines = [
        f"{'step':>4} {'reward':>6} {'tokens':>6} {'roll_s':>6} {'accept':>6} {'sgl_acc':>7} "
        f"{'sd%':>4} {'dver':>9}  gate"
    ]
    for s in summary["steps"]:
        sv = s["served"]
        dver = f"{s['draft_version_before']}->{s['draft_version_after']}"
        gate = s["gate"][-1] if s["gate"] else (s.get("sidecar") or {}).get("push_why") or ""
        lines.append(
            f"{s['step']:>4} {s['reward']:>6.2f} {sv['completion_tokens']:>6d} "
            f"{s['rollout_s']:>6.1f} {fmt(sv['accept_len']):>6} "
            f"{fmt(sv['sglang_accept_len']):>7} {fmt(sv['sd_token_share'], '{:.0%}'):>4} "
            f"{dver:>9}  {gate}"
        )
    acc = summary["served_accept"]
    lines.append(
        f"pushes: {summary['n_pushes']} "
        + ", ".join(
            f"v{p['drafter_version']} (gain {p['gain']:+.3f}, lower {p['gain_lower']:+.3f})" for p in summary["pushes"]
        )
    )
    lines.append(
        f"served accept (tokens/verify pass), first {acc['over_steps']} steps "
        f"{fmt(acc['first'])} -> last {acc['over_steps']} {fmt(acc['last'])}: "
        f"x{fmt(acc['ratio'], '{:.3f}')}"
    )
    return "\n".join(lines)


# ---- the run --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def save_atomic(model, tokenizer, path: Path) -> None:
    """save_pretrained into a temporary sibling, then one rename: the server never reads half."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    os.rename(tmp, path)


def reinforce_step(model, opt, batch: list[tuple[list[int], list[int], float]], group: int) -> float:
    """One policy-gradient step: token-mean log p(response | prompt) x (reward - its prompt group's
    mean reward). Returns the loss."""
    import torch

    rewards = torch.tensor([r for *_, r in batch]).view(-1, group)
    adv = (rewards - rewards.mean(dim=1, keepdim=True)).flatten().tolist()
    opt.zero_grad()
    total = 0.0
    for (prompt, output, _), a in zip(batch, adv):
        if not output or a == 0.0:
            continue
        seq = torch.tensor([prompt + output])
        logp = torch.log_softmax(model(input_ids=seq).logits[0, :-1].float(), -1)
        tok_logp = logp[len(prompt) - 1 :].gather(1, seq[0, len(prompt) :, None])[:, 0]
        loss = -a * tok_logp.mean() / len(batch)
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return total


def run(args: argparse.Namespace) -> dict:
    import httpx
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
    headers = {"Authorization": f"Bearer {key}"}
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
        tok = AutoTokenizer.from_pretrained(args.policy)
        model = AutoModelForCausalLM.from_pretrained(args.policy, dtype=torch.float32)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        client = httpx.Client(timeout=3600)

        def model_info() -> dict:
            return client.get(f"{url}/model_info", headers=headers).json()

        def generate(ids: list[int]) -> dict:
            body = {
                "input_ids": ids,
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": args.max_new_tokens, "temperature": 1.0, "top_p": 1.0},
            }
            resp = client.post(f"{url}/generate", json=body, headers=headers)
            resp.raise_for_status()
            return resp.json()

        n = args.prompts * args.samples
        with ThreadPoolExecutor(max_workers=n) as pool:
            for step in range(args.steps):
                t0 = time.monotonic()
                before = model_info().get("draft_weight_version")
                samples = task.prompts("train", args.prompts, seed=step)
                prompts = [list(s["prompt_ids"]) if "prompt_ids" in s else tok.encode(s["prompt"]) for s in samples]
                batch_ids = [p for p in prompts for _ in range(args.samples)]
                outs = list(pool.map(generate, batch_ids))
                rollout_s = time.monotonic() - t0
                metas = [o["meta_info"] for o in outs]
                rewards = [
                    task.reward(samples[i // args.samples], tok.decode(o["output_ids"], skip_special_tokens=True))
                    for i, o in enumerate(outs)
                ]
                t1 = time.monotonic()
                model.train()
                loss = reinforce_step(
                    model, opt, [(p, o["output_ids"], r) for p, o, r in zip(batch_ids, outs, rewards)], args.samples
                )
                ckpt = out / f"policy_v{step + 1}"
                save_atomic(model, tok, ckpt)
                for route, body in (
                    ("/pause_generation", {}),
                    ("/flush_cache", None),
                    ("/update_weights_from_disk", {"model_path": str(ckpt), "weight_version": str(step + 1)}),
                    ("/continue_generation", {}),
                ):
                    client.post(f"{url}{route}", json=body, headers=headers).raise_for_status()
                update_s = time.monotonic() - t1
                info = client.get(f"{url}/server_info", headers=headers).json()
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
                    "draft_version_after": model_info().get("draft_weight_version"),
                    "gate": gate_statuses(lines),
                    "sidecar_lines": [ln for ln in lines if "[harvest]" not in ln][-20:],
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
