"""A minimal custom RL loop (not gleanrl's trainer) that uses the Harvester as a drop-in.

Each step: sample a group of rollouts from an embedded rollout server concurrently; as each one finishes, hand it to the
Harvester; while the others are still running, let the Harvester train the drafter (it pushes a better one to the server
mid-step with `selector: "draft"`); then one REINFORCE update of the policy (reward: share of digits in the answer,
baseline: the step's mean reward), saved atomically and pushed to the server as the next weight version.

    python examples/custom_loop.py --out /tmp/custom_loop [--model DIR] [--steps 3]

With no `--model`, a tiny random model is made. The server (`gleanrl serve`, a subprocess) and this loop each use one
torch thread. Only the installed `gleanrl` is needed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from gleanrl import DrafterPush, HarvestConfig, Harvester, RolloutClient
from gleanrl.base.atomic import atomic_dir
from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.cli_init import init_drafter
from gleanrl.harvest.spool import SpoolConfig
from gleanrl.trainer.server_proc import EmbeddedServer


def generate(url: str, prompt_ids: list[int], seed: int, max_new_tokens: int) -> dict:
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 1.0, "sampling_seed": seed}
    resp = httpx.post(f"{url}/generate", json={"input_ids": prompt_ids, "sampling_params": sampling}, timeout=300)
    resp.raise_for_status()
    return resp.json()


async def wait_healthy(server: EmbeddedServer) -> None:
    async with RolloutClient([server.url]) as client:
        await client.wait_healthy(180, alive=server.alive)


def reinforce_step(policy, optimizer, batch: list[tuple[list[int], list[int], float]]) -> None:
    """One policy-gradient step: log p(response | prompt) weighted by reward minus the mean reward."""
    baseline = sum(r for _, _, r in batch) / len(batch)
    optimizer.zero_grad()
    for prompt, output, reward in batch:
        ids = torch.tensor([prompt + output])
        logp = torch.log_softmax(policy(input_ids=ids).logits[0, :-1].float(), -1)  # [L-1, V]
        token_logp = logp[len(prompt) - 1 :].gather(1, ids[0, len(prompt) :, None]).sum()
        (-(reward - baseline) * token_logp / len(batch)).backward()
    optimizer.step()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", help="policy (HF directory); default: a tiny random model")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rollouts", type=int, default=12, help="rollouts per step")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    out = Path(args.out)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.model is None:
        from gleanrl.tiny import make_tiny_model

        args.model = str(make_tiny_model(out / "policy_v0"))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    policy = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    save_drafter(init_drafter(args.model, seed=0), out / "drafter_init")

    summary: dict = {"steps": []}
    settings = {"drafter": str(out / "drafter_init"), "sd": "on"}
    with EmbeddedServer(args.model, threads=1, settings=settings, log_path=out / "server.log") as server:
        asyncio.run(wait_healthy(server))
        url = server.url
        cfg = HarvestConfig(push_every=10, spool=SpoolConfig(holdout_every=4))
        harvester = Harvester(policy, out / "drafter_init", out / "spool", push=DrafterPush([url]), cfg=cfg)
        for step in range(args.steps):
            chats = [[{"role": "user", "content": f"what is {i} + {step}?"}] for i in range(args.rollouts)]
            texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
            prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
            batch, accept = [], []
            policy.eval()
            with ThreadPoolExecutor(args.rollouts) as pool:
                # a random tiny model rarely stops by itself: give the last two rollouts a 4x
                # budget, the long tail whose wait the Harvester gleans
                budget = [args.max_new_tokens * (4 if i >= len(prompts) - 2 else 1) for i in range(len(prompts))]
                pending = {pool.submit(generate, url, p, 1000 * step + i, budget[i]): p for i, p in enumerate(prompts)}
                while pending:
                    for fut in [f for f in pending if f.done()]:
                        prompt, res = pending.pop(fut), fut.result()
                        harvester.add_rollout(prompt, res["output_ids"], policy, policy_version=step)
                        text = tokenizer.decode(res["output_ids"], skip_special_tokens=True)
                        batch.append((prompt, res["output_ids"], sum(c.isdigit() for c in text) / max(len(text), 1)))
                        # tokens from verify passes, verify passes (SGLang's counts)
                        verify, accepted = (
                            res["meta_info"].get(k, 0) for k in ("spec_verify_ct", "spec_accept_token_num")
                        )
                        accept.append((verify + accepted, verify))
                    if pending:  # idle window: until the next rollout finishes
                        harvester.train_while(lambda p=pending: p and not any(f.done() for f in p))
            harvester.maybe_push()  # the tail is done: one more chance before the next step
            policy.train()
            reinforce_step(policy, optimizer, batch)
            with atomic_dir(out / f"policy_v{step + 1}") as tmp:
                policy.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
            update = {"model_path": str(out / f"policy_v{step + 1}"), "weight_version": str(step + 1)}
            httpx.post(f"{url}/update_weights_from_disk", json=update, timeout=300).raise_for_status()
            row = {
                "step": step + 1,
                "reward": sum(r for *_, r in batch) / len(batch),
                "server_accept_len": sum(t for t, _ in accept) / max(sum(c for _, c in accept), 1),
                "heldout_accept_len": harvester.score(),
                "drafter_version": harvester.version,
                "idle_train_steps": harvester.idle.steps,
                "idle_train_s": round(harvester.idle.busy_s, 3),
            }
            print(json.dumps(row), flush=True)
            summary["steps"].append(row)
        summary["model_info"] = httpx.get(f"{url}/model_info", timeout=30).json()
    print(json.dumps({"model_info": summary["model_info"], "pushes": harvester.history}), flush=True)
    return summary


if __name__ == "__main__":
    main()
