"""`gleanrl bench e2e`'s summary from each arm's metrics rows; a figure whose arms did not run is None.
Step time is rollout + policy update + weight push; every speedup is against the fastest no-SD arm
(`baseline`), with a 95 % interval from resampling paired steps (`_ci95`); served acceptance is tokens per
verify pass. The ceilings apply Amdahl to the baseline's seconds per running-count bucket: a bucket's time
divides by `sd_speedups[bucket]` (from `gleanrl bench sd --batches ...`), else by the adaptive arm's
served acceptance at <= 2 running (where a CPU verify pass costs about one plain step) and 1 above."""

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
    return _mean(_col(rows, "spec_accept_length")[len(rows) // 2 :])


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
    rollout = total / sum(sec / max(speedups.get(b, 1.0), 1e-9) for b, sec in hist.items())
    return rollout, 1 / ((1 - rollout_share) + rollout_share / rollout)


def summarize(
    runs: dict[str, list[dict]], wall_s: dict[str, float] | None = None, sd_speedups: dict[str, float] | None = None
) -> dict:
    arm = lambda name: runs.get(name) or []  # noqa: E731
    no_sd = [n for n in ("a_no_sd", "a_replicas", "a_sglang") if runs.get(n)]
    baseline = min(no_sd, key=lambda n: sum(step_times(runs[n])), default=None)
    a = arm(baseline) if baseline else []
    b, c, a2, d = arm("b_adaptive"), arm("c_stale"), arm("a_no_sd_seed2"), arm("d_stale_harvest")
    cold, cold_stale = arm("cold_adaptive"), arm("cold_stale")
    off, off_stale = arm("offdomain_adaptive"), arm("offdomain_stale")
    total = lambda rows: sum(step_times(rows)) if rows else None  # noqa: E731
    rollout = lambda rows: sum(_col(rows, "rollout_s")) if rows else None  # noqa: E731
    accept = lambda rows: _mean(_col(rows, "spec_accept_length"))  # noqa: E731
    adaptive = [(name, rows) for name, rows in runs.items() if name.endswith("_adaptive")]
    per_arm = lambda fn: {name: fn(rows) for name, rows in runs.items()}  # noqa: E731
    hist = running_hist(a)
    versus_a = {"e2e": b, "stale": c, "cold": cold, "offdomain": off}  # step-time speedups over the baseline
    ceiling_rollout, ceiling_e2e = ceilings(hist, _ratio(rollout(a), total(a)), accept(b), sd_speedups)
    return {
        "running_hist_s": hist,
        "share_le2_running": _ratio(sum(hist.get(k, 0.0) for k in CHEAP_VERIFY_BUCKETS), sum(hist.values())),
        "running_hist_s_per_arm": per_arm(running_hist),
        "ceiling_rollout": ceiling_rollout,
        "ceiling_e2e": ceiling_e2e,
        "pushes_per_step": per_arm(lambda rows: _mean(_col(rows, "drafter_pushes"))),
        "push_gains": per_arm(lambda rows: [g for r in rows for g in r.get("push_gains") or []]),
        "sched_slowdown": {name: rows[0].get("sched_slowdown") for name, rows in runs.items() if rows},
        "steps": max((len(rows) for rows in runs.values()), default=0),
        "arms": sorted(runs),
        "baseline": baseline,
        "step_time_sglang": step_times(arm("a_sglang")),
        "wall_s": dict(wall_s or {}),
        **{f"speedup_{k}": _ratio(total(a), total(rows)) for k, rows in versus_a.items()},
        "speedup_e2e_ci95": ratio_ci95(step_times(a), step_times(b)),
        "speedup_stale_ci95": ratio_ci95(step_times(a), step_times(c)),
        "speedup_cold_ci95": ratio_ci95(step_times(a), step_times(cold)),
        "replicas_speedup": _ratio(total(arm("a_no_sd")), total(arm("a_replicas"))),
        "replicas_speedup_ci95": ratio_ci95(step_times(arm("a_no_sd")), step_times(arm("a_replicas"))),
        "tok_s": per_arm(lambda rows: _ratio(sum(_col(rows, "output_tokens")), sum(_col(rows, "rollout_s")))),
        "harvest_rollouts_over_stale": _ratio(rollout(c), rollout(b)),
        "speedup_rollout": _ratio(rollout(a), rollout(b)),
        "rollout_share_a": _ratio(rollout(a), total(a)),
        "rollout_share_b": _ratio(rollout(b), total(b)),
        "tail_share_a": _ratio(sum(_col(a, "tail_s")), rollout(a)),
        **{f"step_time_{k}": step_times(rows) for k, rows in (("a", a), ("b", b), ("c", c))},
        "step_time": per_arm(step_times),
        "rollout_time": per_arm(lambda rows: _col(rows, "rollout_s")),
        "accept_per_step": per_arm(lambda rows: _col(rows, "spec_accept_length")),
        **{f"accept_len_{k}": accept(rows) for k, rows in (("adaptive", b), ("stale", c))},
        **{f"tokens_per_pass_{k}": _mean(_col(rows, "tokens_per_pass")) for k, rows in (("adaptive", b), ("stale", c))},
        **{f"accept_len_{k}_per_step": _col(rows, "spec_accept_length") for k, rows in (("adaptive", b), ("stale", c))},
        "accept_ratio": _ratio(accept(b), accept(c)),
        "accept_ratio_late": _ratio(_late(b), _late(c)),
        "samedomain_accept_ratio": _ratio(_late(b), _late(c)),
        "offdomain_accept_ratio": _ratio(_late(off), _late(off_stale)),
        "cold_accept_per_step": _col(cold, "spec_accept_length"),
        "heldout_accept_per_step": {name: [r.get("heldout_accept_len") for r in rows] for name, rows in adaptive},
        "push_why_last": {
            name: rows[-1].get("push_why") for name, rows in runs.items() if rows and rows[-1].get("push_why")
        },
        "cold_stale_accept_per_step": _col(cold_stale, "spec_accept_length"),
        "harvest_cost": _ratio(total(d), total(c)) - 1 if d and c else None,
        **{f"rollout_time_{k}": _col(rows, "rollout_s") for k, rows in (("c", c), ("d", d))},
        "drafter_overhead": _ratio(sum(_col(b, "idle_overrun_s")), total(b)),
        **{k: sum(_col(b, k)) for k in ("idle_window_s", "idle_used_s", "idle_free_core_s", "idle_capture_s")},
        **{k: sum(_col(b, k)) for k in ("idle_train_s", "update_capture_s")},
        **{k: int(sum(_col(b, k))) for k in ("update_captured", "drafter_steps")},
        "drafter_version": int(b[-1].get("drafter_version", 0)) if b else 0,
        **{f"reward_{k}": _col(rows, "reward_mean") for k, rows in (("a", a), ("b", b), ("a_seed2", a2))},
        **{f"accuracy_{k}": _col(rows, "accuracy") for k, rows in (("a", a), ("b", b))},
        "reward_gap_ab": _gap(a, b),
        "reward_noise_seed": _gap(arm("a_no_sd"), a2),
    }


def headline(s: dict) -> str:
    """The summary as the lines the bench prints ('n/a' where the arms did not run)."""
    f = lambda x, spec=".2f": "n/a" if x is None else format(x, spec)  # noqa: E731
    a, b = sum(s["step_time_a"]), sum(s["step_time_b"])
    pushes = ", ".join(f"{k} {f(v)}" for k, v in s["pushes_per_step"].items() if v)
    tok_s = ", ".join(f"{k} {v:.0f}" for k, v in s["tok_s"].items() if v)
    cold = [x and round(x, 2) for x in s["heldout_accept_per_step"].get("cold_adaptive", [])]
    return (
        f"steps {s['steps']}: step time no SD ({s['baseline'] or 'n/a'}) {a:.1f} s, adaptive {b:.1f} s -> speedup "
        f"{f(s['speedup_e2e'])}x {s['speedup_e2e_ci95'] or ''} (ceiling {f(s['ceiling_e2e'])}x; stale "
        f"{f(s['speedup_stale'])}x, cold {f(s['speedup_cold'])}x, off-domain {f(s['speedup_offdomain'])}x); rollouts "
        f"{f(s['speedup_rollout'])}x faster (ceiling {f(s['ceiling_rollout'])}x)\n"
        f"time at <= 2 running {f(s['share_le2_running'], '.0%')} of the baseline's rollouts; pushes per step "
        f"{pushes}\n"
        f"rollout share of the no-SD step {f(s['rollout_share_a'], '.0%')} (goal >= 80%), tail share of its "
        f"rollouts {f(s['tail_share_a'], '.0%')}\n"
        f"served tokens per verify pass adaptive {f(s['accept_len_adaptive'])} vs stale {f(s['accept_len_stale'])} "
        f"(tokens per target pass {f(s['tokens_per_pass_adaptive'])} vs {f(s['tokens_per_pass_stale'])}); second "
        f"half same-domain {f(s['samedomain_accept_ratio'])}x, off-domain {f(s['offdomain_accept_ratio'])}x "
        f"(goal >= 1.4x); cold start per step {[round(x, 2) for x in s['cold_accept_per_step']]}, held-out {cold}\n"
        f"layout: replicas over one server {f(s['replicas_speedup'])}x {s['replicas_speedup_ci95'] or ''}; rollout "
        f"tok/s {tok_s}; harvest arm's rollouts over the stale arm's {f(s['harvest_rollouts_over_stale'])}x\n"
        f"idle window {s['idle_window_s']:.1f} s (a core free {s['idle_free_core_s']:.1f} s): capture "
        f"{s['idle_capture_s']:.1f} s, drafter training {s['idle_train_s']:.1f} s; update-forward capture "
        f"{s['update_capture_s']:.1f} s for {s['update_captured']} rollouts; drafter overhead "
        f"{f(s['drafter_overhead'], '.1%')} of step time\n"
        f"reward gap a/b {f(s['reward_gap_ab'], '.3f')} (seed noise {f(s['reward_noise_seed'], '.3f')}); "
        f"wall time per arm " + ", ".join(f"{k} {v:.0f} s" for k, v in s["wall_s"].items())
    )
