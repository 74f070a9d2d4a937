"""The policies and their warm-start drafters shipped with the project (`gleanrl/shipped/`), so a
newcomer's demo and every bench use the same model on every machine and day, without the ~10-70
minutes of CPU a bootstrap takes.

Each is `gleanrl bootstrap --task TASK --size SIZE --seed 0` (the recipe in `trainer.bootstrap.SIZES`,
its key in `bootstrap.json` beside the weights) and the demo's warm start on it
(`gleanrl.demo_setup.warm_drafter`, its settings in `warm_start.json`), written by scripts/ship_policy.py:
- `deep` (the default): 32 layers of 256 on `doubling_checks` (self-checks: a per-sample tail), the
  shape of the LLMs SD serves (a drafter step ~0.06 of a target step), stored in bf16 and cast at
  load to the dtype asked for (a float32 push updates it: floats are cast, `base.dtypes.fits`);
- `small`: 6 layers of 512 on `doubling`, stored in float32 (made before a push could cast), where
  a drafter step costs ~0.25 of a target step (SD pays little on it: docs/sd.md).
Both are checked before use: the weights' sha256 against `shipped/SHA256SUMS`, the config against the
recipe's shape, and (policy) a quick held-out figure: the reference-solution accuracy on 32 test
prompts must clear a floor far below what the shipped weights score, so a corrupt or foreign file
fails loudly instead of training. `gleanrl demo --from-scratch` (or `gleanrl bootstrap`) rebuilds.
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
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sums_file() -> Path:
    return ROOT / "SHA256SUMS"  # `sha256sum` format, written by scripts/ship_policy.py


def check_hash(directory: Path) -> None:
    weights, sums = directory / "model.safetensors", sums_file()
    name = f"{directory.name}/{weights.name}"
    expected = (
        dict(line.split()[::-1] for line in sums.read_text().splitlines() if line.strip()) if sums.is_file() else {}
    )
    if not weights.is_file() or name not in expected:
        raise ShippedError(
            f"{weights} or its hash in {sums} is missing (a checkout without the "
            "shipped weights? `gleanrl demo --from-scratch` rebuilds the policy)"
        )
    if (got := sha256(weights)) != expected[name]:
        raise ShippedError(f"{weights}: sha256 {got[:16]}... is not the shipped {expected[name][:16]}...")


def shipped_policy(sanity: bool = True, size: str = DEFAULT) -> Path:
    """The shipped policy's directory, checked: hash, shape against the recipe, and (`sanity`) the
    quick held-out figure."""
    from gleanrl.trainer.bootstrap import SIZES, cache_key

    entry = SHIPPED[size]
    policy = entry.policy
    check_hash(policy)
    config = json.loads((policy / "config.json").read_text())
    recipe = SIZES[size]
    shape = (config.get("hidden_size"), config.get("num_hidden_layers"))
    if shape != (recipe.hidden, recipe.layers):
        raise ShippedError(f"{policy}: shape {shape} is not the {size} recipe's {(recipe.hidden, recipe.layers)}")
    recorded = json.loads((policy / "bootstrap.json").read_text()).get("key")
    if recorded != (expected := cache_key(entry.task, 0, size)[1]):
        raise ShippedError(
            f"{policy}: bootstrap key {recorded} is not today's recipe's "
            f"{expected} (the recipe changed: re-ship with scripts/ship_policy.py)"
        )
    if sanity and (accuracy := quick_heldout(policy, task=entry.task)) < SANITY_FLOOR:
        raise ShippedError(
            f"{policy}: held-out reference accuracy {accuracy:.3f} on "
            f"{SANITY_PROMPTS} prompts is under the floor {SANITY_FLOOR}"
        )
    return policy


def policy_or_shipped(model: str | None) -> str:
    """`model`, else the default shipped policy (the benches' default); ValueError if it is not a
    Hugging Face model directory."""
    model = model or str(shipped_policy())
    if not Path(model, "config.json").exists():
        raise ValueError(f"{model} is not a Hugging Face model directory (no config.json)")
    return model


def shipped_drafter(size: str = DEFAULT) -> Path:
    drafter = SHIPPED[size].drafter
    check_hash(drafter)
    return drafter


def shipped_for(policy: Path) -> Shipped | None:
    """The shipped entry whose policy directory `policy` is, if any."""
    return next((e for e in SHIPPED.values() if e.policy.resolve() == policy.resolve()), None)


def quick_heldout(policy: Path, n: int = SANITY_PROMPTS, task: str = "doubling") -> float:
    """Expected T = 1 accuracy from the reference solutions' probabilities on `n` test prompts
    (trainer.tasks.sft.reference_accuracy: one forward each, no sampling)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gleanrl.trainer.tasks import load_task
    from gleanrl.trainer.tasks.sft import reference_accuracy

    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    task = load_task(task)
    return float(reference_accuracy(model, tokenizer, task, task.prompts("test", n, 1))["expected"])
