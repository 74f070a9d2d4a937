"""Stock SGLang CPU as a peer arm of the benches (`.venv-sglang`, `scripts/install_sglang_cpu.sh`): whether
it is installed, and the `gleanrl serve --backend sglang` flags that size its KV pool for the arm."""

from __future__ import annotations


def sglang_missing() -> str | None:
    """None where stock SGLang can be launched, else why not (the arm is then skipped with this reason)."""
    from gleanrl.server.sglang.launch import SGLangLaunchError, sglang_python

    try:
        sglang_python()
    except SGLangLaunchError as exc:
        return str(exc)
    return None


def sglang_serve_args(requests: int, tokens_per_request: int) -> list[str]:
    """A KV pool for `requests` running at once at `tokens_per_request` (serve's CPU default for stock
    SGLang, 8192 tokens, would make it retract in a GRPO step and time the retractions)."""
    return ["--backend", "sglang", f"--sglang-arg=--max-total-tokens={requests * tokens_per_request}"]
