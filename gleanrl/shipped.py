"""The policies and warm-start drafters shipped in `gleanrl/shipped/` (written by scripts/ship_policy.py),
so the demo and the benches use the same model everywhere without a bootstrap: `deep` (the default; 32
layers of 256 on `doubling_checks`, stored in bf16, cast at load) and `small` (6 layers of 512 on
`doubling`, float32). Checked before use: sha256 (`shipped/SHA256SUMS`), the recipe's shape and (policy)
a held-out reference accuracy floor, so a corrupt or foreign file fails loudly.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parent / "shipped"  # a test may point it elsewhere
SANITY_PROMPTS, SANITY_FLOOR = 32, 0.30  # shipped: ~0.6 on these (bootstrap.json)


@dataclass(frozen=True)
class Shipped:
    size: str  # trainer.bootstrap.SIZES
    task: str  # the built-in task it was bootstrapped on
    dtype: str  # how its weights are stored
    regime: str  # the demo's regime on it (trainer.tasks.presets)

    @property
    def policy(self) -> Path:
        return ROOT / f"{self.task}-{self.size}-seed0"

    @property
    def drafter(self) -> Path:
        return ROOT / f"{self.task}-{self.size}-seed0-drafter"


SHIPPED = {
    "small": Shipped("small", "doubling", "float32", "short"),
    "deep": Shipped("deep", "doubling_checks", "bfloat16", "self_checks"),
}
DEFAULT = "deep"  # the demo's and the benches' policy (issue 38: the shape SD serves)


class ShippedError(RuntimeError):
    """The shipped weights are missing, altered, or not what their recipe makes."""


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def sums_file() -> Path:
    return ROOT / "SHA256SUMS"  # `sha256sum` format, written by scripts/ship_policy.py


def check_hash(directory: Path) -> None:
    weights, sums = directory / "model.safetensors", sums_file()
    name = f"{directory.name}/{weights.name}"
    lines = sums.read_text().splitlines() if sums.is_file() else []
    expected = dict(line.split()[::-1] for line in lines if line.strip())
    if not weights.is_file() or name not in expected:
        raise ShippedError(
            f"{weights} or its hash in {sums} is missing (a checkout without the shipped weights? "
            "`gleanrl demo --from-scratch` rebuilds the policy)"
        )
    if (got := sha256(weights)) != expected[name]:
        raise ShippedError(f"{weights}: sha256 {got[:16]}... is not the shipped {expected[name][:16]}...")


def shipped_policy(sanity: bool = True, size: str = DEFAULT) -> Path:
    """The shipped policy's directory, checked: hash, shape against the recipe, (`sanity`) held-out figure."""
    from gleanrl.trainer.bootstrap import SIZES, cache_key

    entry = SHIPPED[size]
    check_hash(policy := entry.policy)
    config = json.loads((policy / "config.json").read_text())
    recipe = SIZES[size]
    shape = (config.get("hidden_size"), config.get("num_hidden_layers"))
    if shape != (recipe.hidden, recipe.layers):
        raise ShippedError(f"{policy}: shape {shape} is not the {size} recipe's {(recipe.hidden, recipe.layers)}")
    recorded = json.loads((policy / "bootstrap.json").read_text()).get("key")
    if recorded != (expected := cache_key(entry.task, 0, size)[1]):
        why = "the recipe changed: re-ship with scripts/ship_policy.py"
        raise ShippedError(f"{policy}: bootstrap key {recorded} is not today's recipe's {expected} ({why})")
    if sanity and (accuracy := quick_heldout(policy, task=entry.task)) < SANITY_FLOOR:
        floor = f"on {SANITY_PROMPTS} prompts is under the floor {SANITY_FLOOR}"
        raise ShippedError(f"{policy}: held-out reference accuracy {accuracy:.3f} {floor}")
    return policy


def policy_or_shipped(model: str | None) -> str:
    """`model`, else the default shipped policy; ValueError if it is not a Hugging Face model directory."""
    model = model or str(shipped_policy())
    if not Path(model, "config.json").exists():
        raise ValueError(f"{model} is not a Hugging Face model directory (no config.json)")
    return model


def shipped_drafter(size: str = DEFAULT) -> Path:
    check_hash(drafter := SHIPPED[size].drafter)
    return drafter


def shipped_for(policy: Path) -> Shipped | None:
    """The shipped entry whose policy directory `policy` is, if any."""
    return next((e for e in SHIPPED.values() if e.policy.resolve() == policy.resolve()), None)


def quick_heldout(policy: Path, n: int = SANITY_PROMPTS, task: str = "doubling") -> float:
    """Expected T = 1 accuracy from the reference solutions' probabilities on `n` test prompts (no sampling)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gleanrl.trainer.tasks import load_task
    from gleanrl.trainer.tasks.sft import reference_accuracy

    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    task = load_task(task)
    return float(reference_accuracy(model, tokenizer, task, task.prompts("test", n, 1))["expected"])
