"""`gleanrl bench swaps`: alternating target and draft weight swaps while greedy requests stream.
Each prompt's reference output under targets A and B is taken alone first; then clients stream while
`--swaps` updates are pushed. Every response must carry pushed versions and equal its target version's
reference (SD is lossless); a response whose target version changes mid-stream (a "straddler", expected
0: an update waits for running requests) must match the old reference before it. Exit 1 on any error."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from pathlib import Path

import httpx

from gleanrl.bench.serve_process import ServeProcess, verdict

PROMPTS = ["The quick brown fox", "Once upon a time", "1 + 1 =", "In the beginning", "alpha beta gamma"]
PROMPTS += ["Weights and measures", "Rollouts finish at", "Speculative decoding"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--swaps", type=int, default=100, help="weight updates, alternating target and draft")
    p.add_argument("--clients", type=int, default=8, help="concurrent streaming clients")
    p.add_argument("--max-new-tokens", type=int, default=16, help="tokens per request")
    p.add_argument("--seed", type=int, default=0, help="seed of the requests and weights")
    p.add_argument("--json", default=None, help="write the summary here")


def make_models(root: Path) -> dict[str, Path]:
    from gleanrl.harvest.checkpoint import save_drafter
    from gleanrl.harvest.cli_init import init_drafter
    from gleanrl.tiny import build_tokenizer, make_tiny_model

    tok = build_tokenizer()
    a, b = (make_tiny_model(root / name, tokenizer=tok, seed=seed) for name, seed in (("A", 0), ("B", 1)))
    drafters = {f"D{seed + 1}": save_drafter(init_drafter(a, seed=seed), root / f"D{seed + 1}") for seed in (0, 1)}
    return {"A": a, "B": b, **drafters}


async def _stream(client: httpx.AsyncClient, prompt: str, max_new: int) -> list[tuple[list[int], str, str]]:
    sp = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True, "stream_interval": 1}
    body = {"text": prompt, "stream": True, "sampling_params": sp}
    chunks = []
    async with client.stream("POST", "/generate", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"status {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                obj = json.loads(line[6:])
                if "error" in obj:
                    raise RuntimeError(str(obj["error"])[:200])
                m = obj["meta_info"]
                chunks.append((obj["output_ids"], m["weight_version"], m["draft_weight_version"]))
    return chunks


async def _push(client: httpx.AsyncClient, path: Path, selector: str, version: str) -> None:
    body = {"model_path": str(path), "selector": selector, "weight_version": version}
    r = await client.post("/update_weights_from_disk", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"{selector} swap to {version}: {r.status_code} {r.text[:200]}")


async def swaps_under_load(
    url: str, models: dict[str, Path], swaps: int, clients: int, max_new: int, seed: int = 0
) -> dict:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        refs: dict[str, dict[str, list[int]]] = {}
        for name in ("B", "A"):  # references with nothing else running; ends serving A
            await _push(client, models[name], "target", f"ref{name}")
            refs[name] = {p: (await _stream(client, p, max_new))[-1][0] for p in PROMPTS}
        assert refs["A"] != refs["B"], "the two targets must differ"
        target_of, drafts = {"refA": "A"}, {"default"}
        counts = ("swaps", "responses", "straddlers", "draft_changes_mid_request", "draft_only_mid_request", "errors")
        s = dict.fromkeys(counts, 0)
        errors: list[str] = []
        done = asyncio.Event()

        async def swapper() -> None:
            try:
                for i in range(swaps):
                    await asyncio.sleep(rng.uniform(0.3, 1.2))  # most requests see no target swap
                    if i % 2 == 0:
                        name = "B" if (i // 2) % 2 == 0 else "A"
                        # registered before the push: responses may carry it at once
                        target_of[f"t{i}"] = name
                        await _push(client, models[name], "target", f"t{i}")
                    else:
                        drafts.add(f"d{i}")
                        await _push(client, models["D2" if (i // 2) % 2 == 0 else "D1"], "draft", f"d{i}")
                    s["swaps"] += 1
            except Exception as exc:  # noqa: BLE001
                s["errors"] += 1
                errors.append(f"swapper: {exc}")
            finally:
                done.set()

        def check(prompt: str, chunks) -> None:
            out, version, draft = chunks[-1]
            if version not in target_of or draft not in drafts:
                raise RuntimeError(f"unknown versions {version!r}/{draft!r}")
            if len({c[2] for c in chunks}) > 1:
                s["draft_changes_mid_request"] += 1
                s["draft_only_mid_request"] += len({c[1] for c in chunks}) == 1
            first = chunks[0][1]
            if all(c[1] == version for c in chunks):
                if out != refs[target_of[version]][prompt]:
                    raise RuntimeError(f"{prompt!r} under {version} ({target_of[version]}) differs from its reference")
                return
            s["straddlers"] += 1
            old = [c[0] for c in chunks if c[1] == first][-1]
            if out[: len(old)] != refs[target_of[first]][prompt][: len(old)]:
                raise RuntimeError(f"{prompt!r}: tokens streamed under {first} differ from its reference")

        async def worker(i: int) -> None:
            wrng = random.Random(seed * 100 + i)
            while not done.is_set():
                prompt = wrng.choice(PROMPTS)
                try:
                    check(prompt, await _stream(client, prompt, max_new))
                    s["responses"] += 1
                except Exception as exc:  # noqa: BLE001
                    s["errors"] += 1
                    errors.append(f"{type(exc).__name__}: {exc}")

        await asyncio.gather(swapper(), *(worker(i) for i in range(clients)))
    return {**s, "error_samples": errors[:5]}


def run(args: argparse.Namespace) -> int:
    if args.swaps < 1 or args.clients < 1 or args.max_new_tokens < 1:
        print("gleanrl bench swaps: --swaps, --clients and --max-new-tokens must be positive", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        models = make_models(Path(tmp))
        extra = ["--drafter", str(models["D1"]), "--sd", "on", "--num-draft-tokens", "3"]
        with ServeProcess(str(models["A"]), Path(tmp) / "server.log", extra=extra) as server:
            load = swaps_under_load(server.url, models, args.swaps, args.clients, args.max_new_tokens, args.seed)
            s = asyncio.run(load)
    print(
        f"swaps: {s['swaps']} of {args.swaps} (alternating target/draft) under {args.clients} streaming clients: "
        f"{s['responses']} greedy responses, {s['responses'] - s['straddlers']} equal to their version's reference "
        f"token for token, {s['straddlers']} straddled a target swap (old-version prefix checked); "
        f"{s['draft_changes_mid_request']} saw a draft swap mid-request ({s['draft_only_mid_request']} of them no "
        f"target swap, checked token for token); {s['errors']} errors"
    )
    return verdict(s, s["errors"] == 0 and s["swaps"] == args.swaps, args.json)
