"""The demo's `report.md` and its PNG plots, from the metrics rows and the response lengths: per step,
where the time went and what SD did (served tokens per verify pass, and output tokens per target pass:
the decode-pass speedup, an upper bound on the wall-clock one; trainer.metrics.acceptance)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

# the table's columns after the step: metrics key and format ("held": the held-out accuracy)
TABLE = [
    c.split(":", 1)
    for c in (
        "reward_mean:.3f accuracy:.2f held: response_len_p50:.0f response_len_p99:.0f rollout_s:.2f rollout_share:.0% "
        "tail_s:.2f tail_share:.0% idle_used_s:.2f idle_used_share:.0% spec_accept_length:.2f heldout_accept_len:.2f "
        "tokens_per_pass:.2f drafter_version: sd_token_share:.0%"
    ).split()
]


def _plot(path: Path, draw) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(6, 3.6))
    draw(ax)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def eval_rows(rows: list[dict], prefix: str = "eval") -> list[dict]:
    return [r for r in rows if r.get(f"{prefix}_accuracy") is not None]


def eval_summary(rows: list[dict]) -> str:
    """One sentence: held-out accuracy first -> last eval with standard errors, and the paired gain."""
    evals = eval_rows(rows)
    if not evals:
        return "No held-out evaluation (eval_every 0)."
    first, last = evals[0], evals[-1]
    acc = lambda r: f"step {r['step']} {r['eval_accuracy']:.3f} ± {r.get('eval_se', 0):.3f}"  # noqa: E731
    text = (
        f"Held-out accuracy ({last.get('eval_prompts')} fixed test prompts, {last.get('eval_rollouts')} samples "
        f"at T={last.get('eval_temperature', 0):g}): {acc(first)} -> {acc(last)}"
    )
    if last is not first and last.get("eval_gain") is not None:
        z = last["eval_gain"] / last["eval_gain_se"] if last.get("eval_gain_se") else float("inf")
        text += f"; paired gain {last['eval_gain']:+.3f} ± {last['eval_gain_se']:.3f} (z = {z:.1f})"
    if greedy := eval_rows(rows, "eval_greedy"):
        g0, g1 = greedy[0]["eval_greedy_accuracy"], greedy[-1]["eval_greedy_accuracy"]
        text += f"; greedy {g0:.3f} -> {g1:.3f} ± {greedy[-1].get('eval_greedy_se', 0):.3f}"
    return text + "."


def totals(rows: list[dict]) -> dict:
    """The run's shares and SD figures, pooled over its steps (time- and pass-weighted, not step means)."""
    add = lambda key: sum(float(r.get(key) or 0.0) for r in rows)  # noqa: E731
    ratio = lambda x, y: x / y if y > 0 else 0.0  # noqa: E731
    return {
        "rollout_share": ratio(add("rollout_s"), add("step_s")),
        "tail_share": ratio(add("tail_s"), add("rollout_s")),
        "idle_used_share": ratio(add("idle_used_s"), add("idle_window_s")),
        "spec_accept_served": ratio(add("spec_tokens"), add("spec_verify_ct")),
        "sd_token_share": ratio(add("spec_tokens"), add("output_tokens")),
        "tokens_per_pass": ratio(add("output_tokens"), add("target_passes")),
        "accept_by_source": by_source(rows),
    }


def by_source(rows: list[dict]) -> dict[str, int]:
    """Accepted draft tokens per SD source over the run (empty where the server reports none)."""
    out: Counter[str] = Counter()
    for r in rows:
        out.update({name: int(n) for name, n in (r.get("spec_accept_token_num_by_source") or {}).items()})
    return dict(out)


def source_text(sources: dict[str, int]) -> str:
    total = sum(sources.values())
    if not total:
        return "The server reported no acceptance by source (one source: the EAGLE-3 drafter)."
    shares = ", ".join(f"{name} {n / total:.0%}" for name, n in sorted(sources.items()))
    return f"Accepted draft tokens by source: {shares}."


def reference_summary(reference: dict | None) -> str:
    """The held-out gain measured without sampling (gleanrl.demo.reference_gain)."""
    if not reference:
        return ""
    r = reference
    z = r["gain"] / r["gain_se"] if r["gain_se"] > 0 else float("nan")
    return (
        f"Held-out accuracy from the reference solutions' probabilities (the same {r['n']} prompts; the expectation "
        f"of T = 1 accuracy, no sampling noise): {r['initial']:.3f} -> {r['final']:.3f}, paired gain {r['gain']:+.3f} "
        f"± {r['gain_se']:.3f} (z = {z:.1f})."
    )


def write_report(
    out: Path,
    rows: list[dict],
    lengths: list[list[int]],
    closing: list[dict],
    info: dict,
    reference: dict | None = None,
) -> Path:
    evals = eval_rows(rows)
    # step 0 holds only the initial policy's evaluation
    rows = [r for r in rows if "reward_mean" in r]
    steps = [r["step"] for r in rows]
    col = lambda key: [float(r.get(key) or 0.0) for r in rows]  # noqa: E731

    def reward(ax):
        ax.plot(steps, col("reward_mean"), marker="o", label="reward")
        ax.plot(steps, col("accuracy"), marker="s", label="accuracy")
        ax.set_xlabel("step"), ax.legend(), ax.set_title("reward and accuracy")

    def accuracy(ax):
        temperature = evals[0].get("eval_temperature", 0) if evals else 0
        for prefix, label in (("eval", f"held-out, T = {temperature:g}"), ("eval_greedy", "held-out, greedy")):
            pts = eval_rows(evals, prefix)
            if pts:
                gain = pts[-1].get(f"{prefix}_gain")
                label += f" ({pts[-1].get(f'{prefix}_prompts')} prompts" + (
                    f"; paired gain {gain:+.3f} ± {pts[-1][f'{prefix}_gain_se']:.3f})" if gain is not None else ")"
                )
                xs, ys = [r["step"] for r in pts], [r[f"{prefix}_accuracy"] for r in pts]
                se = [r.get(f"{prefix}_se", 0) for r in pts]
                ax.errorbar(xs, ys, yerr=se, marker="o", capsize=3, label=label)
        ax.plot(steps, col("accuracy"), ".:", color="gray", label="training batch")
        ax.set_xlabel("step"), ax.set_ylabel("accuracy"), ax.legend(fontsize=7)
        ax.set_title("held-out accuracy (± 1 se over prompts)")

    def accept(ax):
        ax.plot(steps, col("spec_accept_length"), marker="o", label="served: tokens per verify pass")
        ax.plot(steps, col("heldout_accept_len"), marker="s", label="held-out (serving drafter)")
        ax.plot(steps, col("tokens_per_pass"), "^:", label="tokens per target pass (decode speedup)")
        ax.set_xlabel("step"), ax.set_ylabel("tokens per pass"), ax.legend(), ax.set_title("acceptance length")

    def hist(ax):
        ax.hist([n for step in lengths for n in step], bins=40, color="tab:blue")
        ax.set_yscale("log"), ax.set_xlabel("response tokens"), ax.set_ylabel("rollouts")
        ax.set_title("response lengths (all steps): the long tail")

    def breakdown(ax):
        tail, rollout = col("tail_s"), col("rollout_s")
        parts = {"rollouts (before tail)": [r - t for r, t in zip(rollout, tail)], "long tail": tail}
        parts |= {"policy update": col("train_s"), "weight push": col("push_s")}
        bottom = [0.0] * len(steps)
        for name, values in parts.items():
            ax.bar(steps, values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.plot(steps, col("idle_used_s"), "k.--", label="drafter training (in idle time)")
        ax.set_xlabel("step"), ax.set_ylabel("seconds"), ax.legend(fontsize=7), ax.set_title("step time")

    plots = {"accuracy": accuracy, "reward": reward, "accept_length": accept, "lengths": hist, "step_time": breakdown}
    pngs = [_plot(out / f"{name}.png", fn) for name, fn in plots.items()]
    last = rows[-1] if rows else {}
    total = sum(col("rollout_s")) + sum(col("train_s")) + sum(col("push_s"))
    shares = totals(rows)
    lines = [
        "# gleanrl demo",
        "",
        f"{len(rows)} GRPO steps; policy version {info.get('weight_version')}, drafter version "
        f"{info.get('draft_weight_version')} ({sum(1 for r in rows if r.get('drafter_pushes'))} steps with a push).",
        f"Total step time {total:.1f} s, of which long tail {sum(col('tail_s')):.1f} s; drafter training used "
        f"{sum(col('idle_used_s')):.1f} s of idle trainer time and overran a closing window by at most "
        f"{max(col('idle_overrun_s') or [0.0]):.2f} s.",
        f"Rollouts took {shares['rollout_share']:.0%} of the step time, the long tail {shares['tail_share']:.0%} of "
        f"the rollouts; the drafter used {shares['idle_used_share']:.0%} of the idle window. Served acceptance "
        f"{shares['spec_accept_served']:.2f} tokens per verify pass ({shares['sd_token_share']:.0%} of the output "
        f"tokens came from verify passes, the rest from plain decoding); {shares['tokens_per_pass']:.2f} output "
        f"tokens per target pass (decode-pass speedup over plain decoding). {source_text(shares['accept_by_source'])}",
        f"Final reward {last.get('reward_mean', 0):.3f}, accuracy {last.get('accuracy', 0):.2f}; "
        f"served tokens per verify pass first/last step {col('spec_accept_length')[0] if rows else 0:.2f} / "
        f"{last.get('spec_accept_length', 0):.2f}.",
        eval_summary(evals),
        reference_summary(reference),
        "",
        "| step | reward | acc | held-out acc | len p50 | len p99 | rollout s | rollout share | tail s | tail share | "
        "idle s | idle used | tokens/verify | held-out accept | tokens/pass | drafter | SD share |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    held_out = {r["step"]: f"{r['eval_accuracy']:.3f} ± {r.get('eval_se', 0):.3f}" for r in evals}
    if 0 in held_out:
        lines.append(f"| 0 | | | {held_out[0]} |" + " |" * 13)
    for r in rows:
        cells = [held_out.get(r["step"], "") if k == "held" else format(r.get(k) or 0, f) for k, f in TABLE]
        lines.append(f"| {r['step']} | {' | '.join(cells)} |")
    lines += ["", *[f"![{p[:-4]}]({p})" for p in pngs], "", "## Held-out questions, through the OpenAI API (greedy)"]
    lines += ["", f"{sum(c['correct'] for c in closing)} of {len(closing)} right.", ""]
    for c in closing:
        verdict = "right" if c["correct"] else "wrong"
        lines += [f"Q: `{c['question']}` (expected `{c['expected']}`: {verdict})", "", "```", c["answer"], "```", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
