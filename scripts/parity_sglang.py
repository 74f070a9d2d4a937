"""Structured-output parity with stock SGLang, HTTP against HTTP (issue 39, item 4).

`gleanrl serve` and stock SGLang 0.5.23 CPU on the same random tiny Qwen2 (float32: unconstrained greedy
decoding is token-identical), sent the same greedy requests (scripts/parity_cases.py): both outputs,
whether they are identical and whether each is valid, as a markdown table. Findings: docs/parity.md.

    .venv/bin/python scripts/parity_sglang.py [--json parity.json] [--cases json_native,regex]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from parity_cases import CASES, PAIRS, THINK_END_ID, compare, text_of

from gleanrl.bench.serve_process import ServeProcess, sglang_missing
from gleanrl.trainer.server_proc import free_port

# Qwen 2.5's tool layout, shortened (as tests/test_openai_tools.py): tools in a system turn, calls as <tool_call> JSON
TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content }}"
    '{% for c in m.tool_calls %}<tool_call>\n{"name": "{{ c.function.name }}", "arguments": '
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_model(out: Path) -> Path:
    from gleanrl.tiny import build_tokenizer, make_tiny_model

    tok = build_tokenizer(chat_template=TEMPLATE)
    tok.add_tokens(["<think>", "</think>"])  # as in Qwen3 / DeepSeek-R1: one token each
    model = make_tiny_model(out, tokenizer=tok)
    # Re-saved as transformers loads it: its AutoTokenizer gives a qwen2 model Qwen2's pre-tokenizer (digits
    # one by one), while SGLang's get_tokenizer keeps the file's (ByteLevel's GPT-2 split), so the first save
    # tokenizes the same text differently on the two servers; after this both read Qwen2's, as for real Qwen.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tok.save_pretrained(model)
    assert tok.convert_tokens_to_ids("</think>") == THINK_END_ID, "parity_cases.THINK_END_ID is stale"
    return model


def _as_sglang_args(flags: list[str]) -> list[str]:
    """["--a", "x", "--b"] -> ["--a=x", "--b"] (gleanrl serve's --sglang-arg form)."""
    out = []
    for f in flags:
        if f.startswith("--"):
            out.append(f)
        else:
            out[-1] += f"={f}"
    return out


def start_sglang(model: Path, flags: list[str], timeout_s: float = 600):
    from gleanrl.server.sglang.launch import start

    unset = ["drafter", "api_key", "admin_api_key", "context_length", "speculative_num_steps"]
    unset += ["speculative_eagle_topk", "speculative_num_draft_tokens"]
    given = dict(model=str(model), host="127.0.0.1", port=free_port(), device="cpu", dtype="auto")
    given |= {"max_running_requests": 4, "sglang_arg": _as_sglang_args(flags) + ["--max-total-tokens=4096"]}
    args = argparse.Namespace(**dict.fromkeys(unset), **given)
    return start(args, echo=False, timeout_s=timeout_s)


def run_cases(model: Path, names: list[str], log=print) -> list[dict]:
    rows = []
    for pair, flags in PAIRS.items():
        todo = [n for n in names if CASES[n][0] == pair]
        if not todo:
            continue
        t0 = time.monotonic()
        log_path = Path(tempfile.gettempdir()) / f"parity-gleanrl-{pair}.log"
        with ServeProcess(str(model), log_path, extra=["--sd", "off", *flags]) as ours:
            s_proc, s_url = start_sglang(model, flags)
            try:
                up = f"both servers up after {time.monotonic() - t0:.0f}s"
                log(f"[{pair}] {up} (gleanrl {ours.url}, sglang {s_url}, {' '.join(flags)})")
                for n in todo:
                    _, request, check = CASES[n]
                    rows.append(compare(n, request(ours.url), request(s_url), check))
                    r = rows[-1]
                    log(f"  {n}: identical={r['identical']} valid={r['gleanrl_valid']}/{r['sglang_valid']}")
            finally:
                s_proc.stop()
    return rows


def _show(out: dict) -> str:
    if "error" in out:
        return f"error: {out['error']}"
    parts = []
    if out.get("reasoning_content") is not None:
        parts.append(f"reasoning={out['reasoning_content']!r}")
    if out.get("tool_calls"):
        parts.append("calls=" + ", ".join(f"{c['name']}({c['arguments']})" for c in out["tool_calls"]))
    text = text_of(out)
    if text or not parts:
        parts.append(repr(text))
    shown = " ".join(parts).replace("\t", "\\t").replace("|", "\\|").replace("\n", "\\n")
    # a run of one whitespace escape (the grammar's whitespace filled to the limit) as `\t*83`
    return re.sub(r"(\\[tn])\1{7,}", lambda m: f"{m.group(1)}*{len(m.group(0)) // 2}", shown)


def table(rows: list[dict]) -> str:
    lines = [
        "| case | gleanrl serve | stock SGLang 0.5.23 | identical | valid (gleanrl / SGLang) | notes |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    yn = lambda b: "yes" if b else "**no**"  # noqa: E731
    for r in rows:
        raw = "" if r["raw_identical"] in (None, r["identical"]) else f" (raw output: {yn(r['raw_identical'])})"
        same = yn(r["identical"]) + raw
        valid = f"{yn(r['gleanrl_valid'])} / {yn(r['sglang_valid'])}"
        lines.append(
            f"| {r['case']} | `{_show(r['gleanrl'])}` | `{_show(r['sglang'])}` | {same} | {valid} | {r['note']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", help="write the records here")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--model", help="serve this model directory instead of a fresh tiny one")
    args = p.parse_args(argv)
    if (why := sglang_missing()) is not None:
        print(f"stock SGLang is not available: {why}", file=sys.stderr)
        return 2
    names = [n for n in args.cases.split(",") if n]
    if unknown := set(names) - set(CASES):
        p.error(f"unknown cases: {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        model = Path(args.model) if args.model else make_model(Path(tmp) / "model")
        rows = run_cases(model, names, log=lambda s: print(s, file=sys.stderr))
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["gleanrl_valid"] and r["sglang_valid"] for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
