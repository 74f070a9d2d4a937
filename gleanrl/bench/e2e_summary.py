"""`gleanrl bench e2e`'s summary, from each arm's metrics rows. Any subset of arms may have run
(`--arms`): a figure whose arms did not run is None, so the keys are always the same.

Step time is rollout + policy update + weight push (what the trainer waits for). Served acceptance
is each step's tokens per verify pass (`spec_accept_length`, over verify passes only:
trainer.metrics.acceptance), averaged over steps, shown beside output tokens per target pass
(`tokens_per_pass`); the adaptive-over- stale ratios compare the second half of the steps, once the
policy has drifted from what the starting drafter was trained on. The `baseline` is the fastest of
the no-SD arms, `a_no_sd` (gleanrl serve, one server on every core), `a_replicas` (one
single-thread replica per core, the drafter arms' layout) and `a_sglang` (stock SGLang); the `_a`
figures and every speedup are against it, each with a 95 % interval (`_ci95`) from resampling the
steps (arms share each step's prompts and seeds, so step i of one arm pairs with step i of another).
`replicas_speedup`: `a_no_sd`'s step time over `a_replicas`'s (< 1: the replicas are slower);
`tok_s`: each arm's rollout tokens per second (arms sample different tokens, so their lengths drift
apart: step times alone mix speed and length).
`rollout_share_a` is the baseline's rollout time over its step time: the share SD can speed up at
all, so the bound on `speedup_e2e`.

The ceiling (`ceiling_rollout`, `ceiling_e2e`): what the cost model allows this regime on this
machine, by Amdahl over the baseline's time-weighted histogram of running requests
(`running_hist_s`, trainer.metrics.running_seconds): a bucket's time divides by its SD speedup
`sd_speedups[bucket]` (measured by `gleanrl bench sd --batches ...`, passed in), else by the
adaptive arm's served tokens per verify pass where a verify pass costs about one plain step
(running x (k + 1) rows under the CPU's ridge of ~15: buckets 1 and 2) and not at all above it; the
update and push do not speed up."""

from __future__ import annotations


def step_times(rows: list[dict]) -> list[float]:
    return [r["rollout_s"] + r["train_s"] + r["push_s"] for r in rows]


def ratio_ci95(x: list[float], y: list[float], resamples: int = 4000, seed: int = 0) -> list[float] | None:
    """95 % interval of sum(x) / sum(y) by the paired bootstrap over steps (x[i] pairs with y[i])."""
    import random

    n = min(len(x), len(y))
    if n < 2:
        return None
    rng, ratios = random.Random(seed), []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(sum(x[i] for i in idx) / max(sum(y[i] for i in idx), 1e-12))
    ratios.sort()
    return [round(ratios[int(0.025 * resamples)], 4), round(ratios[int(0.975 * resamples) - 1], 4)]


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def _col(rows: list[dict], key: str) -> list[float]:
    return [float(r.get(key) or 0.0) for r in rows]


def _late(rows: list[dict]) -> float | None:
    """Mean served acceptance over the second half of the steps (all of them for a single step)."""
    accept = _col(rows, "spec_accept_length")
    return _mean(accept[len(accept) // 2 :])


def _gap(x: list[dict], y: list[dict]) -> float | None:
    return _mean([abs(p - q) for p, q in zip(_col(x, "reward_mean"), _col(y, "reward_mean"))]) if x and y else None


CHEAP_VERIFY_BUCKETS = ("1", "2")  # running counts whose verify pass costs about one plain step


def running_hist(rows: list[dict]) -> dict[str, float]:
    """Seconds spent at each running-count bucket, summed over the steps."""
    out: dict[str, float] = {}
    for r in rows:
        for bucket, sec in (r.get("running_s") or {}).items():
            out[bucket] = out.get(bucket, 0.0) + sec
    return out


def ceilings(
    hist: dict[str, float],
    rollout_share: float | None,
    accept: float | None,
    sd_speedups: dict[str, float] | None = None,
) -> tuple[float | None, float | None]:
    """(rollout, end-to-end) speedup ceilings by Amdahl over the running-count histogram."""
    total = sum(hist.values())
    if not total or rollout_share is None:
        return None, None
    speedups = sd_speedups or {b: accept or 1.0 for b in CHEAP_VERIFY_BUCKETS}
    after = sum(sec / max(speedups.get(b, 1.0), 1e-9) for b, sec in hist.items())
    rollout = total / after
    return rollout, 1 / ((1 - rollout_share) + rollout_share / rollout)


def summarize(
    runs: dict[str, list[dict]], wall_s: dict[str, float] | None = None, sd_speedups: dict[str, float] | None = None
) -> dict:
    arm = lambda name: runs.get(name) or []  # noqa: E731
    baseline = min(
        (n for n in ("a_no_sd", "a_replicas", "a_sglang") if runs.get(n)),
        key=lambda n: sum(step_times(runs[n])),
        default=None,
    )
    a = arm(baseline) if baseline else []
    b, c, a2, d = arm("b_adaptive"), arm("c_stale"), arm("a_no_sd_seed2"), arm("d_stale_harvest")
    cold, cold_stale = arm("cold_adaptive"), arm("cold_stale")
    off, off_stale = arm("offdomain_adaptive"), arm("offdomain_stale")
    total = lambda rows: sum(step_times(rows)) if rows else None  # noqa: E731
    rollout = lambda rows: sum(_col(rows, "rollout_s")) if rows else None  # noqa: E731
    accept = lambda rows: _mean(_col(rows, "spec_accept_length"))  # noqa: E731
    hist = running_hist(a)
    ceiling_rollout, ceiling_e2e = ceilings(hist, _ratio(rollout(a), total(a)), accept(b), sd_speedups)
    return {
        "running_hist_s": hist,
        "share_le2_running": _ratio(sum(hist.get(k, 0.0) for k in CHEAP_VERIFY_BUCKETS), sum(hist.values())),
        "running_hist_s_per_arm": {name: running_hist(rows) for name, rows in runs.items()},
        "ceiling_rollout": ceiling_rollout,
        "ceiling_e2e": ceiling_e2e,
        "pushes_per_step": {name: _mean(_col(rows, "drafter_pushes")) for name, rows in runs.items()},
        "push_gains": {name: [g for r in rows for g in r.get("push_gains") or []] for name, rows in runs.items()},
        "sched_slowdown": {name: rows[0].get("sched_slowdown") for name, rows in runs.items() if rows},
        "steps": max((len(rows) for rows in runs.values()), default=0),
        "arms": sorted(runs),
        "baseline": baseline,
        "step_time_sglang": step_times(arm("a_sglang")),
        "wall_s": dict(wall_s or {}),
        "speedup_e2e": _ratio(total(a), total(b)),
        "speedup_stale": _ratio(total(a), total(c)),
        "speedup_e2e_ci95": ratio_ci95(step_times(a), step_times(b)),
        "speedup_stale_ci95": ratio_ci95(step_times(a), step_times(c)),
        "speedup_cold_ci95": ratio_ci95(step_times(a), step_times(cold)),
        "replicas_speedup": _ratio(total(arm("a_no_sd")), total(arm("a_replicas"))),
        "replicas_speedup_ci95": ratio_ci95(step_times(arm("a_no_sd")), step_times(arm("a_replicas"))),
        "tok_s": {
            name: _ratio(sum(_col(rows, "output_tokens")), sum(_col(rows, "rollout_s"))) for name, rows in runs.items()
        },
        "harvest_rollouts_over_stale": _ratio(rollout(c), rollout(b)),
        "speedup_cold": _ratio(total(a), total(cold)),
        "speedup_offdomain": _ratio(total(a), total(off)),
        "speedup_rollout": _ratio(rollout(a), rollout(b)),
        "rollout_share_a": _ratio(rollout(a), total(a)),
        "rollout_share_b": _ratio(rollout(b), total(b)),
        "tail_share_a": _ratio(sum(_col(a, "tail_s")), rollout(a)),
        "step_time_a": step_times(a),
        "step_time_b": step_times(b),
        "step_time_c": step_times(c),
        "step_time": {name: step_times(rows) for name, rows in runs.items()},
        "rollout_time": {name: _col(rows, "rollout_s") for name, rows in runs.items()},
        "accept_per_step": {name: _col(rows, "spec_accept_length") for name, rows in runs.items()},
        "accept_len_adaptive": accept(b),
        "accept_len_stale": accept(c),
        "tokens_per_pass_adaptive": _mean(_col(b, "tokens_per_pass")),
        "tokens_per_pass_stale": _mean(_col(c, "tokens_per_pass")),
        "accept_len_adaptive_per_step": _col(b, "spec_accept_length"),
        "accept_len_stale_per_step": _col(c, "spec_accept_length"),
        "accept_ratio": _ratio(accept(b), accept(c)),
        "accept_ratio_late": _ratio(_late(b), _late(c)),
        "samedomain_accept_ratio": _ratio(_late(b), _late(c)),
        "offdomain_accept_ratio": _ratio(_late(off), _late(off_stale)),
        "cold_accept_per_step": _col(cold, "spec_accept_length"),
        "heldout_accept_per_step": {
            name: [r.get("heldout_accept_len") for r in rows]
            for name, rows in runs.items()
            if name.endswith("_adaptive")
        },
        "push_why_last": {
            name: rows[-1].get("push_why") for name, rows in runs.items() if rows and rows[-1].get("push_why")
        },
        "cold_stale_accept_per_step": _col(cold_stale, "spec_accept_length"),
        "harvest_cost": _ratio(total(d), total(c)) - 1 if d and c else None,
        "rollout_time_c": _col(c, "rollout_s"),
        "rollout_time_d": _col(d, "rollout_s"),
        "drafter_overhead": _ratio(sum(_col(b, "idle_overrun_s")), total(b)),
        "idle_window_s": sum(_col(b, "idle_window_s")),
        "idle_used_s": sum(_col(b, "idle_used_s")),
        "idle_free_core_s": sum(_col(b, "idle_free_core_s")),
        "idle_capture_s": sum(_col(b, "idle_capture_s")),
        "idle_train_s": sum(_col(b, "idle_train_s")),
        "update_capture_s": sum(_col(b, "update_capture_s")),
        "update_captured": int(sum(_col(b, "update_captured"))),
        "drafter_steps": int(sum(_col(b, "drafter_steps"))),
        "drafter_version": int(b[-1].get("drafter_version", 0)) if b else 0,
        "reward_a": _col(a, "reward_mean"),
        "reward_b": _col(b, "reward_mean"),
        "reward_a_seed2": _col(a2, "reward_mean"),
        "accuracy_a": _col(a, "accuracy"),
        "accuracy_b": _col(b, "accuracy"),
        "reward_gap_ab": _gap(a, b),
        "reward_noise_seed": _gap(arm("a_no_sd"), a2),
    }


def headline(s: dict) -> str:
    """The summary as the lines the bench prints ('n/a' where the arms did not run)."""
    f = lambda x, spec=".2f": "n/a" if x is None else format(x, spec)  # noqa: E731
    a, b = sum(s["step_time_a"]), sum(s["step_time_b"])
    return (
        f"steps {s['steps']}: step time no SD ({s['baseline'] or 'n/a'}) {a:.1f} s, adaptive {b:.1f} s -> "
        f"speedup {f(s['speedup_e2e'])}x {s['speedup_e2e_ci95'] or ''} "
        f"(ceiling {f(s['ceiling_e2e'])}x; stale {f(s['speedup_stale'])}x, cold "
        f"{f(s['speedup_cold'])}x, off-domain {f(s['speedup_offdomain'])}x); rollouts "
        f"{f(s['speedup_rollout'])}x faster (ceiling {f(s['ceiling_rollout'])}x)\n"
        f"time at <= 2 running {f(s['share_le2_running'], '.0%')} of the baseline's rollouts; "
        f"pushes per step " + ", ".join(f"{k} {f(v)}" for k, v in s["pushes_per_step"].items() if v) + "\n"
        f"rollout share of the no-SD step {f(s['rollout_share_a'], '.0%')} (goal >= 80%), tail share of its "
        f"rollouts {f(s['tail_share_a'], '.0%')}\n"
        f"served tokens per verify pass adaptive {f(s['accept_len_adaptive'])} vs stale "
        f"{f(s['accept_len_stale'])} (tokens per target pass {f(s['tokens_per_pass_adaptive'])} vs "
        f"{f(s['tokens_per_pass_stale'])}); second "
        f"half same-domain {f(s['samedomain_accept_ratio'])}x, off-domain {f(s['offdomain_accept_ratio'])}x "
        f"(goal >= 1.4x); cold start per step {[round(x, 2) for x in s['cold_accept_per_step']]}, "
        f"held-out {[x and round(x, 2) for x in s['heldout_accept_per_step'].get('cold_adaptive', [])]}\n"
        f"layout: replicas over one server {f(s['replicas_speedup'])}x "
        f"{s['replicas_speedup_ci95'] or ''}; rollout tok/s "
        + ", ".join(f"{k} {v:.0f}" for k, v in s["tok_s"].items() if v)
        + "; harvest arm's rollouts over the stale arm's "
        f"{f(s['harvest_rollouts_over_stale'])}x\n"
        f"idle window {s['idle_window_s']:.1f} s (a core free {s['idle_free_core_s']:.1f} s): "
        f"capture {s['idle_capture_s']:.1f} s, drafter training "
        f"{s['idle_train_s']:.1f} s; update-forward capture {s['update_capture_s']:.1f} s for "
        f"{s['update_captured']} rollouts; drafter overhead {f(s['drafter_overhead'], '.1%')} of step time\n"
        f"reward gap a/b {f(s['reward_gap_ab'], '.3f')} (seed noise {f(s['reward_noise_seed'], '.3f')}); "
        f"wall time per arm " + ", ".join(f"{k} {v:.0f} s" for k, v in s["wall_s"].items())
    )
