"""Per-step metrics: one line on the terminal and one row in `OUT/metrics.jsonl`."""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

from gleanrl.clients.rollout import Rollout

COLUMNS = [  # (key, header, width, format); a key missing from a row prints blank
    ("step", "step", 4, "{:d}"),
    ("reward_mean", "reward", 6, "{:.3f}"),
    ("accuracy", "acc", 5, "{:.2f}"),
    ("eval_accuracy", "eval", 5, "{:.3f}"),
    ("eval_se", "±se", 5, "{:.3f}"),
    ("response_len_p50", "len50", 5, "{:.0f}"),
    ("response_len_p99", "len99", 5, "{:.0f}"),
    ("rollout_s", "rollout_s", 9, "{:.2f}"),
    ("tail_s", "tail_s", 6, "{:.2f}"),
    ("train_s", "train_s", 7, "{:.2f}"),
    ("rollout_share", "roll%", 5, "{:.0%}"),
    ("tokens_per_s", "tok/s", 6, "{:.0f}"),
    ("tokens_per_pass", "tok/pass", 8, "{:.2f}"),
    ("logprob_mismatch", "lp_mism", 7, "{:.1e}"),
    ("weight_version", "ver", 4, "{}"),
]


HARVEST_COLUMNS = [  # from HarvestHooks.step_metrics and the rollouts, shown when harvest is on
    ("idle_used_s", "idle_s", 6, "{:.2f}"),
    ("drafter_version", "dver", 4, "{}"),
    ("spec_accept_length", "acc_len", 7, "{:.2f}"),
    ("heldout_accept_len", "ho_acc", 6, "{:.2f}"),
    ("sd_token_share", "sd%", 4, "{:.0%}"),
]


def format_row(row: dict, columns: list = COLUMNS) -> str:
    return "  ".join((fmt.format(row[k]) if row.get(k) is not None else "").rjust(w) for k, _, w, fmt in columns)


def format_header(columns: list = COLUMNS) -> str:
    return "  ".join(h.rjust(w) for _, h, w, _ in columns)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); 0 for an empty list."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)])


def tail_seconds(finish_times: list[float]) -> float:
    """Seconds while at most a quarter of the requests still run: from the finish leaving <= N/4 to the last."""
    if not finish_times:
        return 0.0
    ordered = sorted(finish_times)
    k = math.ceil(0.75 * len(ordered))  # after k finishes, n - k <= n/4 still run
    return ordered[-1] - ordered[max(k, 1) - 1]


# running-count buckets of `running_seconds`: upper bounds (SD's cost per token changes with them)
RUNNING_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def running_seconds(intervals: list[tuple[float, float]]) -> dict[str, float]:
    """Seconds spent with 1, 2, 3-4, 5-8 ... requests running, from (submitted, finished) times; keys are the
    buckets' upper bounds ("1", "2", "4", ..., "inf")."""
    events = sorted([(t0, 1) for t0, _ in intervals] + [(t1, -1) for _, t1 in intervals])
    out = {str(b): 0.0 for b in (*RUNNING_BUCKETS, "inf")}
    running, last = 0, None
    for t, delta in events:
        if running and last is not None:
            bucket = next((b for b in RUNNING_BUCKETS if running <= b), "inf")
            out[str(bucket)] += t - last
        running, last = running + delta, t
    return out


def rollout_metrics(rollouts: list[Rollout], t_start: float, t_end: float, accuracy_of) -> dict:
    lens = [len(r.output_ids) for r in rollouts]
    finished = [r.finished_at for r in rollouts if r.finished_at is not None]
    ttft = [r.first_token_at - r.submitted_at for r in rollouts if r.first_token_at and r.submitted_at]
    rollout_s = t_end - t_start
    rewards = [float(r.reward) for r in rollouts if r.reward is not None]
    return {
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "accuracy": sum(accuracy_of(r) for r in rollouts) / len(rollouts) if rollouts else 0.0,
        "response_len_mean": sum(lens) / len(lens) if lens else 0.0,
        "response_len_p50": percentile(lens, 50),
        "response_len_p99": percentile(lens, 99),
        "truncated_frac": sum(r.status.value == "truncated" for r in rollouts) / max(len(rollouts), 1),
        "rollout_s": rollout_s,
        "tail_s": tail_seconds(finished),
        "running_s": running_seconds(
            [(r.submitted_at, r.finished_at) for r in rollouts if None not in (r.submitted_at, r.finished_at)]
        ),
        "ttft_p50_s": percentile(ttft, 50),
        "tokens_per_s": sum(lens) / rollout_s if rollout_s > 0 else 0.0,
        **sd_stats(rollouts),
    }


def sd_stats(rollouts: list[Rollout]) -> dict:
    """The step's SD, pooled from SGLang's per-request counts (`spec_verify_ct` verify passes,
    `spec_accept_token_num` drafts accepted); `spec_tokens`: output tokens from verify passes."""
    verify_ct = sum(r.spec_verify_ct for r in rollouts)
    accepted = sum(r.spec_accept_token_num for r in rollouts)
    tokens = sum(len(r.output_ids) for r in rollouts)
    sources: dict[str, int] = {}  # accepted draft tokens per source, where the server reports them
    for r in rollouts:
        for name, n in r.spec_accept_token_num_by_source.items():
            sources[name] = sources.get(name, 0) + n
    return {
        "spec_verify_ct": verify_ct,
        "spec_accept_token_num": accepted,
        "spec_tokens": verify_ct + accepted,
        "output_tokens": tokens,
        "target_passes": tokens - accepted,
        "spec_accept_token_num_by_source": sources,
        **acceptance(verify_ct, accepted, tokens),
    }


def acceptance(spec_verify_ct: int, spec_accept_token_num: int, output_tokens: int) -> dict:
    """gleanrl's two SD figures. `spec_accept_length`: (accepted + passes) / passes over verify passes, in [1, k + 1].
    `tokens_per_pass`: output tokens per target pass, plain and prefill passes included (each emits one token beyond its
    accepted drafts: passes = tokens - accepted); 1.0 without SD, an upper bound on the speedup. Not SGLang's
    per-request `spec_accept_length` (tokens / verify passes), which with adaptive SD can exceed k + 1."""
    passes = output_tokens - spec_accept_token_num
    return {
        "spec_accept_length": (spec_verify_ct + spec_accept_token_num) / spec_verify_ct if spec_verify_ct else 0.0,
        "tokens_per_pass": output_tokens / passes if passes > 0 else 0.0,
    }


def step_shares(row: dict) -> dict:
    """Where a step's time went: rollouts' share of rollout + update + push, the tail's share of the rollouts,
    and (with harvest) the share of the idle window the drafter used."""
    step_s = row["rollout_s"] + row["train_s"] + row["push_s"]
    out = {
        "step_s": step_s,
        "rollout_share": row["rollout_s"] / step_s if step_s > 0 else 0.0,
        "tail_share": row["tail_s"] / row["rollout_s"] if row["rollout_s"] > 0 else 0.0,
    }
    if row.get("idle_window_s"):
        out["idle_used_share"] = row.get("idle_used_s", 0.0) / row["idle_window_s"]
    return out


def eval_metrics(rollouts: list[Rollout], correct_of, baseline: list[float] | None = None) -> dict:
    """Held-out accuracy, se over prompts (one prompt's samples are not independent). `eval_scores`: per-prompt
    means in prompt order; with `baseline` scores of an earlier eval on the same prompts and seeds, the paired
    gain and its se (`eval_gain`, `eval_gain_se`): far tighter than comparing two accuracies."""
    groups: dict[int, list[float]] = {}
    for r in rollouts:
        groups.setdefault(r.group_id, []).append(correct_of(r))
    scores = [sum(v) / len(v) for _, v in sorted(groups.items())]
    acc, se = mean_se(scores)
    row = {
        "eval_accuracy": acc,
        "eval_se": se,
        "eval_prompts": len(scores),
        "eval_rollouts": len(rollouts),
        "eval_len_mean": _mean([len(r.output_ids) for r in rollouts]),
        "eval_scores": scores,
    }
    if baseline is not None and len(baseline) == len(scores):
        row["eval_gain"], row["eval_gain_se"] = mean_se([s - b for s, b in zip(scores, baseline)])
    return row


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error (sample std / sqrt(n); 0 for fewer than two values)."""
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return _mean(values), se


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


class MetricsLog:
    """Appends rows to `OUT/metrics.jsonl` (each flushed and fsynced) and prints a table line."""

    def __init__(self, out: str | Path, resume_step: int | None = None, harvest: bool = False):
        self.path = Path(out) / "metrics.jsonl"
        self.columns = COLUMNS + HARVEST_COLUMNS if harvest else COLUMNS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._printed_header = False
        if self.path.exists():  # drop rows of steps lost to a crash (or everything on a fresh run)
            keep = [
                line
                for line in self.path.read_text().splitlines()
                if line.strip() and resume_step is not None and json.loads(line)["step"] <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in keep))

    def first(self, key: str):
        """`key` of the first row that has it (e.g. the step-0 eval after a resume), else None."""
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                if line.strip() and key in (row := json.loads(line)):
                    return row[key]
        return None

    def log(self, row: dict, echo=print) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if not self._printed_header:
            echo(format_header(self.columns))
            self._printed_header = True
        echo(format_row(row, self.columns))
