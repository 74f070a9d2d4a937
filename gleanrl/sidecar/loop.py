"""The sidecar's loop (see `sidecar.cli`): read the feed, follow the policy, open an idle window
while the server is idle and close it when it gets busy; one metrics row per policy version."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from threading import Event

import httpx
import torch

from gleanrl.base.atomic import atomic_file, remove_stale_temporaries
from gleanrl.clients.rollout import FinishedRollout
from gleanrl.clients.weight_sync import DrafterPush
from gleanrl.harvest.hooks import HarvestHooks
from gleanrl.sidecar.server_view import Policy, ServerView
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


def rollout(rec: dict, tokenizer) -> FinishedRollout | None:
    """A feed record as the hooks take it; None for aborted or empty ones."""
    if (rec.get("finish_reason") or {}).get("type") == "abort" or not rec.get("output_ids"):
        return None
    prompt = rec["prompt_ids"] if rec.get("prompt_ids") is not None else tokenizer.encode(rec["prompt_text"])
    return FinishedRollout(prompt, rec["output_ids"]).read_meta(rec)


class Sidecar:
    def __init__(
        self,
        view: ServerView,
        out: Path,
        drafter: str | None,
        cold: bool,
        resume: bool,
        idle_running: int,
        save_every_s: float,
        poll_s: float,
        echo=print,
    ):
        self.view, self.out, self.idle_running, self.echo = view, out, idle_running, echo
        self.save_every_s, self.poll_s = save_every_s, poll_s
        if resume:  # what a kill -9 left half-written: the state file's, a drafter version's temporaries
            for directory in (out, out / "drafter_versions"):
                if directory.is_dir():
                    remove_stale_temporaries(directory)
        state = torch.load(out / STATE_FILE, weights_only=False) if resume and (out / STATE_FILE).exists() else None
        if state is not None:
            view.load_state_dict(state["view"])
        self.policy = view.policy()
        if cold:
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
