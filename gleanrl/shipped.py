"""The demo policy and its warm-start drafter, shipped with the project (`gleanrl/shipped/`), so a
newcomer's demo and every bench use the same model on every machine and day, without the ~10-70
minutes of CPU a bootstrap takes.

The policy is `gleanrl bootstrap --size small --seed 0` (the recipe in `trainer.bootstrap.SIZES`,
its key in `bootstrap.json` beside the weights), stored in float32 (the trainer's checkpoints are
float32, and a policy push must match the serving model's dtypes; a bf16 file failed the demo's
first push); the drafter is the demo's warm start on it
(`gleanrl.demo.warm_drafter`, its settings in `warm_start.json`). Both are checked before use:
the weights' sha256 against `shipped/SHA256SUMS`, the config against the recipe's shape, and (policy)
a quick held-out figure: the reference-solution accuracy on 32 test prompts must clear a floor far
below what the shipped weights score, so a corrupt or foreign file fails loudly instead of training.
`gleanrl demo --from-scratch` (or `gleanrl bootstrap`) rebuilds the policy instead.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).parent / "shipped"
POLICY = ROOT / "doubling-small-seed0"
DRAFTER = ROOT / "doubling-small-seed0-drafter"
SUMS = ROOT / "SHA256SUMS"  # `sha256sum` format, written by scripts/ship_policy.py
SANITY_PROMPTS, SANITY_FLOOR = 32, 0.30   # shipped: ~0.6 on these (bootstrap.json)


class ShippedError(RuntimeError):
    """The shipped weights are missing, altered, or not what their recipe makes."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_hash(directory: Path) -> None:
    weights = directory / "model.safetensors"
    name = f"{directory.name}/{weights.name}"
    expected = dict(line.split()[::-1] for line in SUMS.read_text().splitlines() if line.strip()) \
        if SUMS.is_file() else {}
    if not weights.is_file() or name not in expected:
        raise ShippedError(f"{weights} or its hash in {SUMS} is missing (a checkout without the "
                           "shipped weights? `gleanrl demo --from-scratch` rebuilds the policy)")
    if (got := sha256(weights)) != expected[name]:
        raise ShippedError(f"{weights}: sha256 {got[:16]}... is not the shipped "
                           f"{expected[name][:16]}...")


def shipped_policy(sanity: bool = True) -> Path:
    """The shipped policy's directory, checked: hash, shape against the recipe, and (`sanity`) the
    quick held-out figure."""
    from gleanrl.trainer.bootstrap import SIZES, cache_key

    check_hash(POLICY)
    config = json.loads((POLICY / "config.json").read_text())
    size = SIZES["small"]
    shape = (config.get("hidden_size"), config.get("num_hidden_layers"))
    if shape != (size.hidden, size.layers):
        raise ShippedError(f"{POLICY}: shape {shape} is not the small recipe's "
                           f"{(size.hidden, size.layers)}")
    recorded = json.loads((POLICY / "bootstrap.json").read_text()).get("key")
    if recorded != (expected := cache_key(None, 0, "small")[1]):
        raise ShippedError(f"{POLICY}: bootstrap key {recorded} is not today's recipe's "
                           f"{expected} (the recipe changed: re-ship with scripts/ship_policy.py)")
    if sanity and (accuracy := quick_heldout(POLICY)) < SANITY_FLOOR:
        raise ShippedError(f"{POLICY}: held-out reference accuracy {accuracy:.3f} on "
                           f"{SANITY_PROMPTS} prompts is under the floor {SANITY_FLOOR}")
    return POLICY


def policy_or_shipped(model: str | None) -> str:
    """`model`, else the shipped demo policy (the benches' default); ValueError if it is not a
    Hugging Face model directory."""
    model = model or str(shipped_policy())
    if not Path(model, "config.json").exists():
        raise ValueError(f"{model} is not a Hugging Face model directory (no config.json)")
    return model


def shipped_drafter() -> Path:
    check_hash(DRAFTER)
    return DRAFTER


def quick_heldout(policy: Path, n: int = SANITY_PROMPTS) -> float:
    """Expected T = 1 accuracy from the reference solutions' probabilities on `n` test prompts
    (trainer.tasks.sft.reference_accuracy: one forward each, no sampling)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gleanrl.trainer.tasks import load_task
    from gleanrl.trainer.tasks.sft import reference_accuracy

    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    task = load_task("doubling")
    return float(reference_accuracy(model, tokenizer, task, task.prompts("test", n, 1))["expected"])
