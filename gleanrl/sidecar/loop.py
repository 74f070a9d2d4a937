"""The sidecar's loop (see `sidecar.cli`): read the feed, follow the policy, open an idle window while the server is
idle and close it when it gets busy; one metrics row per policy version.

What it reads from the rollout server (or `gleanrl proxy`), `ServerView`: the harvest feed with a cursor, the server's
load and the policy it serves, which the sidecar follows by loading `/model_info`'s `model_path` again whenever
(`model_path`, `weight_version`) changes. Weights sent by `update_weights_from_tensor` or `_distributed` reach no
directory the sidecar could read: when the feed's latest policy update is one of those, or `model_path` is no model
directory on this machine (the sidecar needs the trainer's checkpoints on a shared filesystem), following stops with
`FollowError`.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from threading import Event

import httpx
import torch

from gleanrl.base.atomic import atomic_file, remove_stale_temporaries
from gleanrl.clients.rollout import FinishedRollout
from gleanrl.clients.weight_sync import DrafterPush
from gleanrl.harvest.hooks import HarvestHooks
from gleanrl.trainer.metrics import MetricsLog

STATE_FILE = "sidecar_state.pt"
COLUMNS = [  # (key, header, width, format), as trainer.metrics.COLUMNS
    ("step", "pver", 4, "{:d}"),
    ("weight_version", "wver", 6, "{}"),
    ("harvested", "caught", 6, "{:d}"),
    ("drafter_steps", "dsteps", 6, "{:d}"),
    ("drafter_version", "dver", 4, "{}"),
    ("drafter_pushes", "push", 4, "{:d}"),
    ("heldout_accept_len", "ho_acc", 6, "{:.2f}"),
    ("served_accept_len", "served", 6, "{:.2f}"),
    ("idle_used_s", "idle_s", 6, "{:.1f}"),
    ("feed_missed", "missed", 6, "{:d}"),
    ("cpu_share", "cpu", 4, "{:.0%}"),
]
PROGRESS_S = 10.0
TRAIN_POLL_S = 0.2  # feed and load polled this often while the drafter trains
UNREACHABLE_WAIT_S = 2.0
FOLLOWABLE = ("disk",)  # the policy updates whose weights the sidecar can read


class FollowError(RuntimeError):
    """The sidecar cannot follow the server's policy; the message says why and what to do."""


@dataclass(slots=True)
class Policy:
    model_path: str
    weight_version: str
    version: int  # the sidecar's policy version (HarvestHooks: step - 1), 0, 1, ...


@dataclass
class ServerView:
    url: str
    admin_api_key: str | None = None
    api_key: str | None = None
    timeout_s: float = 60.0
    cursor: int = 0
    feed_id: str | None = None
    versions: dict[str, int] = field(default_factory=dict)  # "model_path|weight_version" -> policy version
    missed: int = 0  # records the feed dropped before the sidecar read them

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=self.timeout_s)

    def _get(self, path: str, **params) -> dict:
        key = (self.admin_api_key or self.api_key) if path == "/harvest_feed" else self.api_key  # SGLang's levels
        resp = self._http.get(path, params=params, headers={"Authorization": f"Bearer {key}"} if key else {})
        if resp.status_code != 200:
            try:
                message = resp.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = resp.text[:300]
            raise FollowError(f"{self.url}{path}: HTTP {resp.status_code}: {message}")
        return resp.json()

    def read(self, wait_s: float = 0.0) -> dict:
        """The next page of the feed (`records`, `load`); advances the cursor and counts what was missed."""
        page = self._get("/harvest_feed", cursor=self.cursor, wait_s=wait_s)
        if page["feed_id"] != self.feed_id:
            if self.feed_id is not None:  # a restarted server: its feed starts again at 0
                page = self._get("/harvest_feed", cursor=0)
            self.feed_id = page["feed_id"]
        self.missed += page["missed"]
        self.cursor = page["next_cursor"]
        last = page["weight_updates"][-1] if page["weight_updates"] else None  # how the policy served now came
        if last is not None and last["kind"] not in FOLLOWABLE:
            raise FollowError(
                f"the policy was updated by update_weights_from_{last['kind']} (weight_version "
                f"{last['weight_version']}): those weights never reach a directory the sidecar can read, so it "
                "cannot follow them; update the policy with update_weights_from_disk"
            )
        return page

    def policy(self) -> Policy:
        """The policy the server serves now, numbered in the order the sidecar first saw each one."""
        info = self._get("/model_info")
        path, weight_version = str(info.get("model_path")), str(info.get("weight_version"))
        if not (Path(path) / "config.json").is_file():
            raise FollowError(
                f"the server's model_path {path!r} is not a model directory on this machine: run the sidecar "
                "where the trainer's checkpoints are (a shared filesystem)"
            )
        key = f"{path}|{weight_version}"
        if key not in self.versions:
            self.versions[key] = max(self.versions.values(), default=-1) + 1
        return Policy(path, weight_version, self.versions[key])

    def state_dict(self) -> dict:
        return {"cursor": self.cursor, "feed_id": self.feed_id, "versions": dict(self.versions), "missed": self.missed}

    def load_state_dict(self, state: dict) -> None:
        self.cursor, self.feed_id = int(state["cursor"]), state["feed_id"]
        self.versions, self.missed = dict(state["versions"]), int(state["missed"])

    def close(self) -> None:
        self._http.close()


def rollout(rec: dict, tokenizer) -> FinishedRollout | None:
    """A feed record as the hooks take it; None for aborted or empty ones."""
    if (rec.get("finish_reason") or {}).get("type") == "abort" or not rec.get("output_ids"):
        return None
    prompt = rec["prompt_ids"] if rec.get("prompt_ids") is not None else tokenizer.encode(rec["prompt_text"])
    return FinishedRollout(prompt, rec["output_ids"]).read_meta(rec)


class Sidecar:
    """`gleanrl harvest`'s run: `args` its flags (`drafter`, `cold`, `resume`, `idle_running`, `save_every_s`,
    `poll_s`); the state of a resumed run is loaded, the harvest's first step started."""

    def __init__(self, view: ServerView, out: Path, args, echo=print):
        self.view, self.out, self.echo, resume = view, out, echo, args.resume
        self.idle_running, self.save_every_s, self.poll_s = args.idle_running, args.save_every_s, args.poll_s
        if resume:  # what a kill -9 left half-written: the state file's, a drafter version's temporaries
            for directory in (out, out / "drafter_versions"):
                if directory.is_dir():
                    remove_stale_temporaries(directory)
        state = torch.load(out / STATE_FILE, weights_only=False) if resume and (out / STATE_FILE).exists() else None
        if state is not None:
            view.load_state_dict(state["view"])
        self.policy, drafter = view.policy(), args.drafter
        if args.cold:
            drafter = str(out / "drafter_init")
            if not (Path(drafter) / "config.json").is_file():
                from gleanrl.harvest.checkpoint import save_drafter
                from gleanrl.harvest.cli_init import init_drafter

                save_drafter(init_drafter(self.policy.model_path), drafter)
        self.hooks, serving = HarvestHooks.for_run(self.policy.model_path, drafter, out, resume)
        if state is not None:
            self.hooks.load_state_dict(state["hooks"])
        # drafters go to the server (or proxy) read from; after a resume the serving version is pushed again
        self.hooks.bind_push(DrafterPush([view.url], api_key=view.api_key, admin_api_key=view.admin_api_key))
        self.metrics = MetricsLog(out, resume_step=self.policy.version - 1 if state else None)
        self.metrics.columns = COLUMNS
        self.window = None
        self._errors_seen = len(self.hooks.h.history)
        policy = f"policy {self.policy.model_path} (weight_version {self.policy.weight_version})"
        resumed = " (resumed)" if state else ""
        echo(f"gleanrl harvest: {view.url}, {policy}, drafter {serving}{resumed}", file=sys.stderr)
        self._start_step(self.policy)

    def _start_step(self, policy: Policy) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.policy = policy
        self.model = AutoModelForCausalLM.from_pretrained(policy.model_path, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(policy.model_path)
        self.hooks.on_step_start(policy.version + 1, self.model)  # the hooks' policy version is step - 1
        self._served = [0, 0]  # tokens from verify passes, verify passes
        self._t0, self._cpu0, self._missed0 = time.monotonic(), time.process_time(), self.view.missed

    def _end_step(self, partial: bool = False) -> None:
        wall, cpu = time.monotonic() - self._t0, time.process_time() - self._cpu0
        row = {"step": self.policy.version, "weight_version": self.policy.weight_version, **self.hooks.step_metrics()}
        row["served_accept_len"] = self._served[0] / self._served[1] if self._served[1] else None
        row |= {"feed_missed": self.view.missed - self._missed0, "wall_s": wall, "cpu_share": cpu / max(wall, 1e-9)}
        row |= {"partial": True} if partial else {}
        self.metrics.log(row, echo=lambda line: self.echo(line, file=sys.stderr))

    def _close_window(self) -> None:
        if self.window is not None:
            self.window.close()
            self.window = None

    def save(self) -> None:
        self._close_window()  # the harvester's state is taken between windows
        state = {"hooks": self.hooks.state_dict(), "view": self.view.state_dict(), "step": self.policy.version}
        with atomic_file(self.out / STATE_FILE) as f:
            torch.save(state, f)
        self._saved_at = time.monotonic()

    def run(self, stop: Event) -> None:
        self.save()  # a resumable state from the start
        shown = time.monotonic()
        while not stop.is_set():
            try:
                page = self.view.read(wait_s=0.0 if self.window else self.poll_s)
                policy = self.view.policy()
            except httpx.TransportError as exc:  # a restarting server: wait for it, training stops meanwhile
                self._close_window()
                self.echo(f"gleanrl harvest: warning: {self.view.url} unreachable ({exc}); retrying", file=sys.stderr)
                stop.wait(UNREACHABLE_WAIT_S)
                continue
            if (policy.model_path, policy.weight_version) != (self.policy.model_path, self.policy.weight_version):
                self._close_window()
                self._end_step()
                self._start_step(policy)
                self.save()
            for rec in page["records"]:
                if (r := rollout(rec, self.tokenizer)) is not None:
                    self.hooks.on_rollout_finished(r)
                    self._served[0] += r.sd_tokens
                    self._served[1] += r.spec_verify_ct
            load = page["load"]
            idle = bool(load.get("paused")) or (load.get("num_running_reqs") or 0) <= self.idle_running
            if idle and self.window is None:
                self.window = self.hooks.idle_window()
                self.window.open()
            elif not idle:
                self._close_window()
            if time.monotonic() - self._saved_at >= self.save_every_s:
                self.save()
            self._warn_push_errors()
            if time.monotonic() - shown >= PROGRESS_S:
                shown = time.monotonic()
                self._progress(page)
            if self.window is not None:
                stop.wait(TRAIN_POLL_S)

    def _warn_push_errors(self) -> None:
        """A refused push leaves the server on its drafter and training goes on (as in `gleanrl train`)."""
        for entry in self.hooks.h.history[self._errors_seen :]:
            if entry.get("error"):
                self.echo(f"gleanrl harvest: warning: push refused: {entry['error']}", file=sys.stderr)
        self._errors_seen = len(self.hooks.h.history)

    def _progress(self, page: dict) -> None:
        h, status = self.hooks.h, "training" if self.window else "waiting (server busy)"
        feed = f"feed {page['next_cursor']} read, {self.view.missed} missed | captured {self.hooks.captured}"
        push = h.push_status(h.history[-1] if h.history else None)
        line = f"[harvest] policy v{self.policy.version} | {feed} | drafter steps {h.steps}, v{h.version} | {status}"
        self.echo(f"{line} | {push}", file=sys.stderr)

    def shutdown(self) -> None:
        """Close the window (within one micro-step), log the step so far, save: nothing half-written."""
        self._close_window()
        self._end_step(partial=True)
        self.save()
        self.view.close()
