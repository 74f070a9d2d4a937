"""The sidecar figure's arithmetic (scripts/measure_sidecar.py; tests/test_measure_sidecar.py): the
served acceptance from responses' `meta_info`, the gate's words from the sidecar's log, each push
from its metrics rows, the summary and its table."""

from __future__ import annotations

GATE_TAG = "[harvest]"


def served_acceptance(metas: list[dict]) -> dict:
    """Pooled SD figures over responses' `meta_info`: `accept_len` tokens per verify pass over the
    SD passes (None without any), `sglang_accept_len` SGLang's completion tokens / verify passes
    (plain-decoded tokens included), `sd_token_share` the share of tokens emitted by verify passes."""
    verify = sum(m.get("spec_verify_ct") or 0 for m in metas)
    accepted = sum(m.get("spec_accept_token_num") or 0 for m in metas)
    tokens = sum(m.get("completion_tokens") or 0 for m in metas)
    accept, sglang = ((verify + accepted) / verify, tokens / verify) if verify else (None, None)
    share = (verify + accepted) / tokens if tokens else None
    out = {"accept_len": accept, "sglang_accept_len": sglang, "sd_token_share": share}
    return out | {"verify_passes": verify, "completion_tokens": tokens}


def acceptance_by_drafter(metas: list[dict]) -> dict[str, dict]:
    """`served_acceptance` per the `draft_weight_version` each response reports."""
    groups: dict[str, list[dict]] = {}
    for m in metas:
        groups.setdefault(str(m.get("draft_weight_version")), []).append(m)
    return {v: served_acceptance(ms) for v, ms in sorted(groups.items())}


def gate_statuses(lines: list[str]) -> list[str]:
    """The distinct gate words (the progress line's last field) in order first seen, and every refused push."""
    whys = []
    for line in lines:
        if GATE_TAG in line and " | " in line:
            whys.append(line.rsplit(" | ", 1)[1].strip())
        elif "push refused" in line:
            whys.append(line.strip())
    return list(dict.fromkeys(whys))


def pushes_from_metrics(rows: list[dict]) -> list[dict]:
    """Each push the sidecar's metrics rows record: the policy version it happened under, the
    drafter version it made, its paired gain and the gain's lower bound (tokens per verify pass)."""
    out = []
    for row in rows:
        gains = row.get("push_gains") or []
        end = row.get("drafter_version")
        first = (end - len(gains) + 1) if isinstance(end, int) else None
        for i, (gain, lower) in enumerate(gains):
            push = {"sidecar_step": row.get("step"), "weight_version": row.get("weight_version")}
            push["drafter_version"] = first + i if first is not None else None
            out.append(push | {"gain": gain, "gain_lower": lower})
    return out


def mean_accept(steps: list[dict]) -> float | None:
    """Pooled tokens per verify pass over several steps."""
    served = [s["served"] for s in steps if s["served"]["verify_passes"]]
    verify = sum(s["verify_passes"] for s in served)
    return sum(s["accept_len"] * s["verify_passes"] for s in served) / verify if verify else None


SIDECAR_KEYS = ("weight_version", "harvested", "drafter_steps", "drafter_version", "drafter_pushes")
SIDECAR_KEYS += ("drafter_push_attempts", "push_why", "push_gains", "heldout_accept_len", "candidate_accept_len")
SIDECAR_KEYS += ("served_accept_len", "idle_used_s", "cpu_share")


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
    accept = {"first": first, "last": last, "over_steps": k, "ratio": last / first if first and last else None}
    summary = {**meta, "steps": steps, "sidecar_rows": sidecar_rows, "pushes": pushes, "n_pushes": len(pushes)}
    final = steps[-1]["draft_version_after"] if steps else None
    return summary | {"served_accept": accept, "draft_weight_version_final": final}


def fmt(x, spec: str = "{:.2f}") -> str:
    return "-" if x is None else spec.format(x)


def table(summary: dict) -> str:
    head = f"{'step':>4} {'reward':>6} {'tokens':>6} {'roll_s':>6} {'accept':>6} {'sgl_acc':>7} {'sd%':>4}"
    lines = [f"{head} {'dver':>9}  gate"]
    for s in summary["steps"]:
        sv = s["served"]
        dver = f"{s['draft_version_before']}->{s['draft_version_after']}"
        gate = s["gate"][-1] if s["gate"] else (s.get("sidecar") or {}).get("push_why") or ""
        row = f"{s['step']:>4} {s['reward']:>6.2f} {sv['completion_tokens']:>6d} {s['rollout_s']:>6.1f}"
        share = fmt(sv["sd_token_share"], "{:.0%}")
        lines.append(f"{row} {fmt(sv['accept_len']):>6} {fmt(sv['sglang_accept_len']):>7} {share:>4} {dver:>9}  {gate}")
    acc = summary["served_accept"]
    pushes = ", ".join(
        f"v{p['drafter_version']} (gain {p['gain']:+.3f}, lower {p['gain_lower']:+.3f})" for p in summary["pushes"]
    )
    lines.append(f"pushes: {summary['n_pushes']} {pushes}")
    k = acc["over_steps"]
    lines.append(
        f"served accept (tokens/verify pass), first {k} steps {fmt(acc['first'])} -> last {k} {fmt(acc['last'])}: "
        f"x{fmt(acc['ratio'], '{:.3f}')}"
    )
    return "\n".join(lines)
