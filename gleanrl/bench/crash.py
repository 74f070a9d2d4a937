"""`gleanrl bench crash`: kill -9 the trainer (GRPO with harvest) at chosen points, resume, and check that
nothing was lost or half-written. Run i starts a trainer process (`child`, which marks its phases in
OUT/phases.log) against one long-lived server, SIGKILLs it in phase PHASES[i % 4] of a random step, checks
every checkpoint, spool shard and drafter loads, at most the step in flight is lost and the server is left
idle, then `--resume` must finish with one metrics row per step. Exit 1 on any failure."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

PHASES = ("rollouts", "drafter", "checkpoint", "push")
DELAY_S = {"rollouts": 0.02, "drafter": 0.3, "checkpoint": 0.005, "push": 0.03}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=10, help="kill-and-resume runs (phases cycle)")
    p.add_argument("--steps", type=int, default=3, help="RL steps per run")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill points")
    p.add_argument("--json", default=None, help="write the per-run results here")


def child(spec: dict) -> None:
    """The trainer under test: `train` with harvest hooks, marking its phases in OUT/phases.log."""
    from gleanrl.clients.weight_sync import DrafterPush
    from gleanrl.harvest.config import HarvestConfig
    from gleanrl.harvest.harvester import Harvester
    from gleanrl.harvest.hooks import HarvestHooks
    from gleanrl.trainer import loop, run
    from gleanrl.trainer.config import TrainConfig

    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / "phases.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    state = {"step": 0, "phase": None}

    def mark(phase: str) -> None:
        if state["phase"] != phase:
            state["phase"] = phase
            os.write(fd, f"{state['step']} {phase}\n".encode())

    class Hooks(HarvestHooks):
        def on_step_start(self, step, model):
            state["step"] = step
            mark("rollouts")
            super().on_step_start(step, model)

    save = run.save_checkpoint

    def marked_save(*a, **kw):
        mark("checkpoint")
        path = save(*a, **kw)
        mark("push")  # the loop pushes the checkpoint right after saving it
        return path

    run.save_checkpoint = marked_save
    cfg = HarvestConfig(push_every=3, batch_size=2, seed=spec["seed"])
    harvester = Harvester(spec["model"], spec["drafter"], out / "harvest" / "spool", DrafterPush([spec["url"]]), cfg)
    train_micro_step = harvester.train_micro_step

    def marked_micro_step():
        if len(harvester.spool):  # with an empty spool the micro-step has nothing to train on
            mark("drafter")
        return train_micro_step()

    harvester.train_micro_step = marked_micro_step
    rl = dict(prompts_per_step=2, samples_per_prompt=3, max_new_tokens=48, lr=1e-3, keep_last=2, server_wait_s=60)
    rl |= dict(model=spec["model"], out=str(out), servers=[spec["url"]], steps=spec["steps"], seed=spec["seed"])
    loop.train(TrainConfig(**rl), hooks=Hooks(harvester), resume=spec["resume"])


def _launch(spec: dict, log: Path) -> subprocess.Popen:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "gleanrl.bench.crash", json.dumps(spec)]
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)


def _phases(out: Path) -> list[tuple[int, str]]:
    path = out / "phases.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(s), p) for s, p in (line.split() for line in lines if len(line.split()) == 2)]


def check_disk(out: Path) -> list[str]:
    """Problems with what a killed trainer left: any checkpoint, spool shard or drafter that does not load."""
    import torch
    from safetensors.torch import load_file  # reads every tensor

    from gleanrl.harvest.checkpoint import load_drafter
    from gleanrl.trainer.checkpoint import STATE_FILE, list_checkpoints

    problems = []
    for step, path in list_checkpoints(out):
        try:
            json.loads((path / "config.json").read_text())
            for f in path.glob("*.safetensors"):
                load_file(f)
            assert torch.load(path / STATE_FILE, weights_only=False)["step"] == step
        except Exception as exc:  # noqa: BLE001
            problems.append(f"checkpoint {path.name}: {type(exc).__name__}: {exc}")
    shards = [("spool", load_file, f) for f in sorted((out / "harvest" / "spool").glob("[0-9]*.safetensors"))]
    drafters = [("drafter", load_drafter, d) for d in sorted((out / "harvest" / "drafter_versions").glob("v*"))]
    for what, load, path in shards + drafters:
        try:
            load(path)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{what} {path.name}: {exc}")
    return problems


def _server_idle(url: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = httpx.get(f"{url}/server_info", timeout=10).json()["internal_states"][0]
        if (st["num_running_reqs"] == 0 and st["num_queue_reqs"] == 0) or time.monotonic() > deadline:
            return st
        time.sleep(0.2)


def crash_run(
    i: int, phase: str, root: Path, url: str, model: str, drafter: str, steps: int, rng: random.Random
) -> dict:
    """One kill-and-resume run; returns its record with `problems` (empty when all checks pass)."""
    from gleanrl.trainer.checkpoint import list_checkpoints

    out, log = root / f"run{i}", root / f"run{i}.log"
    spec = {"out": str(out), "model": model, "drafter": drafter, "url": url, "steps": steps, "seed": i, "resume": False}
    at_step, proc = rng.randint(1, steps), _launch(spec, log)
    rec: dict = {"run": i, "target": f"{phase}@{at_step}", "problems": []}
    problems = rec["problems"]
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        seen = _phases(out)
        if (at_step, phase) in seen or any(s > at_step for s, _ in seen):
            time.sleep(rng.uniform(0, DELAY_S[phase]))
            break
        time.sleep(0.005)
    if proc.poll() is not None:
        problems.append(f"the trainer ended (rc {proc.returncode}) before the kill point; see {log}")
        return rec
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    seen = _phases(out)
    killed_step, phase_killed = seen[-1] if seen else (0, "startup")
    rec["killed_in"] = f"{phase_killed}@{killed_step}"
    last = rec["last_checkpoint"] = max((s for s, _ in list_checkpoints(out)), default=0)
    if last < killed_step - 1:
        problems.append(f"lost more than the step in flight: last checkpoint {last}, killed in step {killed_step}")
    problems += check_disk(out)
    # a temporary sibling of a write the kill interrupted: invisible to readers, removed by nobody
    rec["leftover_tmp"] = sorted(p.name for p in out.rglob(".*tmp-*"))
    st = _server_idle(url)
    if st["paused"] or st["num_running_reqs"] or st["num_queue_reqs"]:
        problems.append(
            f"server left paused={st['paused']} running={st['num_running_reqs']} queued={st['num_queue_reqs']}"
        )
    resumed = _launch({**spec, "resume": True}, log)
    try:
        rc = resumed.wait(timeout=900)
    except subprocess.TimeoutExpired:
        resumed.kill()
        rc = "timeout"
    metrics = out / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    rec["metrics_steps"] = [r["step"] for r in rows]
    want = list(range(1, steps + 1))
    # killed while pushing: the step's checkpoint is complete and resumed from (the push is redone
    # by the resume's resync), but its metrics row, written after the push, is gone with the process
    pushed_lost = [s for s in want if s != killed_step] if rec["killed_in"].startswith("push") else want
    if rc != 0 or rec["metrics_steps"] not in (want, pushed_lost):
        problems.append(f"resume: rc {rc}, metrics steps {rec['metrics_steps']}; see {log}")
    problems += check_disk(out)
    if left := sorted(p.name for p in out.rglob(".*tmp-*")):
        problems.append(f"temporaries of interrupted writes still there after the resume: {left}")
    return rec


def run(args: argparse.Namespace) -> int:
    if args.runs < 1 or args.steps < 1:
        print("gleanrl bench crash: --runs and --steps must be >= 1", file=sys.stderr)
        return 2
    from gleanrl.bench.serve_process import ServeProcess, write_json
    from gleanrl.harvest.checkpoint import save_drafter
    from gleanrl.harvest.cli_init import init_drafter
    from gleanrl.tiny import make_tiny_model

    rng = random.Random(args.seed)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = make_tiny_model(root / "policy")
        drafter = save_drafter(init_drafter(model), root / "drafter0")
        with ServeProcess(str(model), root / "server.log", extra=["--drafter", str(drafter), "--sd", "on"]) as server:
            for i in range(args.runs):
                rec = crash_run(i, PHASES[i % len(PHASES)], root, server.url, str(model), str(drafter), args.steps, rng)
                records.append(rec)
                problems = "; ".join(rec["problems"])
                print(
                    f"run {i}: target {rec['target']}, killed in {rec.get('killed_in')}, last checkpoint "
                    f"{rec.get('last_checkpoint')}, resumed metrics steps {rec.get('metrics_steps')}, leftover "
                    f"temporaries {rec.get('leftover_tmp')}: {'FAIL ' + problems if problems else 'ok'}",
                    flush=True,
                )
    bad = [r for r in records if r["problems"]]
    print(
        f"crash: {len(records)} kill -9 runs, {len(records) - len(bad)} resumed with at most the step in flight lost, "
        f"no half-written checkpoint/spool/drafter, server never left paused; {len(bad)} failed"
    )
    write_json(args.json, records)
    print("FAIL" if bad else "PASS")
    return 1 if bad else 0


if __name__ == "__main__":
    child(json.loads(sys.argv[1]))
