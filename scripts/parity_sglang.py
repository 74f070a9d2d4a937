"""Structured-output parity with stock SGLang, HTTP against HTTP (issue 39, item 4).

Starts `gleanrl serve` (embedded engine) and stock SGLang 0.5.23 CPU (`.venv-sglang`, made by
scripts/install_sglang_cpu.sh; launched through `gleanrl.server.sglang.launch.start`, as the
SGLang tests and the bench's SGLang arm do) on the same tiny model, each on a loopback port, sends
both the same greedy requests and compares: json_schema (native `sampling_params` and the chat
route's `response_format`), regex, ebnf, a named `tool_choice` (`--tool-call-parser qwen25` on
both) and a reasoning parser (`--reasoning-parser deepseek-r1` on both: the `reasoning_content`
split); the cases and how each is judged: scripts/parity_cases.py. For each case it records both
outputs, whether they are identical and whether each is valid, and prints a markdown table
(`--json F` also writes the records).

The model: a random tiny Qwen2 from `gleanrl.tiny` (4 layers, 64 wide, a 384-token byte-level BPE
vocabulary plus `<think>` / `</think>`), with a chat template in Qwen 2.5's tool layout. SGLang loads
it on CPU in float32 like the embedded engine, so unconstrained greedy decoding is token-identical
(tests/sglang/test_sglang_parity.py); a random model's greedy text is arbitrary, which makes it a
strict test of the constraints: whatever the grammar leaves open, the model fills in, the same way
on both servers only where both grammars allow the same tokens.

    .venv/bin/python scripts/parity_sglang.py [--json parity.json] [--cases json_native,regex]

Three pairs of servers are started one after the other (`PAIRS`), each pair with the same flags:
the tool-call parser with the default JSON whitespace rule, the same with
`--constrained-json-disable-any-whitespace` (the structured-output and tool cases), and the reasoning
parser (both apply a chat request's grammar, and /generate's with `require_reasoning`, only after the
reasoning end when a reasoning parser is on, so those cases are kept apart). Findings and the measured
table: docs/parity.md.
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

from gleanrl.bench.serve_process import ServeProcess
from gleanrl.bench.sglang_arm import sglang_missing
from gleanrl.trainer.server_proc import free_port

# Qwen 2.5's tool layout, shortened (as tests/test_openai_tools.py): tools in a system turn,
# calls as <tool_call> JSON
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


# ---------------------------------------------------------------- servers
def make_model(out: Path) -> Path:
    from gleanrl.tiny import build_tokenizer, make_tiny_model

    tok = build_tokenizer(chat_template=TEMPLATE)
    tok.add_tokens(["<think>", "</think>"])  # as in Qwen3 / DeepSeek-R1: one token each
    model = make_tiny_model(out, tokenizer=tok)
    # Re-saved as transformers loads it: its AutoTokenizer gives a qwen2 model Qwen2's
    # pre-tokenizer (digits one by one), while SGLang's get_tokenizer keeps the file's
    # (ByteLevel's GPT-2 split), so the first save tokenizes the same text differently on the
    # two servers (17 vs 20 tokens for PROMPT); after this both read Qwen2's, as for real
    # Qwen checkpoints.
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

    args = argparse.Namespace(
        model=str(model),
        drafter=None,
        host="127.0.0.1",
        port=free_port(),
        api_key=None,
        admin_api_key=None,
        device="cpu",
        dtype="auto",
        context_length=None,
        max_running_requests=4,
        speculative_num_steps=None,
        speculative_eagle_topk=None,
        speculative_num_draft_tokens=None,
        sglang_arg=_as_sglang_args(flags) + ["--max-total-tokens=4096"],
    )
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
                log(
                    f"[{pair}] both servers up after {time.monotonic() - t0:.0f}s "
                    f"(gleanrl {ours.url}, sglang {s_url}, {' '.join(flags)})"
                )
                for n in todo:
                    _, request, check = CASES[n]
                    rows.append(compare(n, request(ours.url), request(s_url), check))
                    log(
                        f"  {n}: identical={rows[-1]['identical']} "
                        f"valid={rows[-1]['gleanrl_valid']}/{rows[-1]['sglang_valid']}"
                    )
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
    for r in rows:
        yn = lambda b: "yes" if b else "**no**"  # noqa: E731
        same = yn(r["identical"]) + (
            "" if r["raw_identical"] in (None, r["identical"]) else f" (raw output: {yn(r['raw_identical'])})"
        )
        lines.append(
            f"| {r['case']} | `{_show(r['gleanrl'])}` | `{_show(r['sglang'])}` | "
            f"{same} | {yn(r['gleanrl_valid'])} / {yn(r['sglang_valid'])} | "
            f"{r['note']} |"
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
