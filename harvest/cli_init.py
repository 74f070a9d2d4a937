"""`gleanrl draft init`: a randomly initialised EAGLE-3 drafter for a target model: a frozen copy of the target's
embedding (as SGLang shares it), `lm_head` and the final `norm` from the target's (initial logits in its output space),
`fc` and the decoder layer random (seeded).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open

from gleanrl.harvest.checkpoint import save_drafter
from gleanrl.harvest.drafter import Eagle3Drafter
from gleanrl.harvest.drafter_config import DrafterConfig


def read_target_tensors(model_dir: str | Path, suffixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The target's tensors whose names end with one of `suffixes`, from (possibly sharded) safetensors."""
    found: dict[str, torch.Tensor] = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                for suffix in suffixes:
                    if key.endswith(suffix) and suffix not in found:
                        found[suffix] = f.get_tensor(key)
    return found


def init_drafter(
    model_dir: str | Path,
    seed: int = 0,
    aux_layer_ids: list[int] | None = None,
    draft_token_ids: torch.Tensor | None = None,
) -> Eagle3Drafter:
    """A new drafter for the target in `model_dir`. `draft_token_ids`: target ids of a reduced draft vocabulary
    (default: the whole target vocabulary)."""
    model_dir = Path(model_dir)
    try:
        target = json.loads((model_dir / "config.json").read_text())
    except FileNotFoundError:
        raise ValueError(f"{model_dir} is not a model directory (no config.json)") from None
    target = target.get("text_config", target)
    ids = None if draft_token_ids is None else torch.as_tensor(draft_token_ids, dtype=torch.long).sort().values
    config = DrafterConfig.for_target(target, aux_layer_ids, None if ids is None else int(ids.numel()))
    torch.manual_seed(seed)
    drafter = Eagle3Drafter(config)
    t = read_target_tensors(model_dir, ("embed_tokens.weight", "lm_head.weight", "model.norm.weight"))
    if "embed_tokens.weight" not in t:
        raise ValueError(f"no embed_tokens.weight in the safetensors files of {model_dir}")
    head = t.get("lm_head.weight", t["embed_tokens.weight"])  # tied embeddings have no lm_head
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(t["embed_tokens.weight"])
        if ids is not None:
            drafter.set_draft_vocab(ids)
        drafter.lm_head.weight.copy_(head[drafter.draft_to_target()])
        if "model.norm.weight" in t:
            drafter.norm.weight.copy_(t["model.norm.weight"])
    return drafter


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="target model directory (Hugging Face, safetensors)")
    parser.add_argument("--out", required=True, help="directory to write the drafter to")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fresh weights")
    layer_ids = "aux layer ids a,b,c (SGLang's eagle_aux_hidden_state_layer_ids); default as SGLang"
    parser.add_argument("--layer-ids", default=None, help=layer_ids)


def parse_layer_ids(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--layer-ids must be comma-separated integers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    try:
        drafter = init_drafter(args.model, args.seed, parse_layer_ids(args.layer_ids))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    save_drafter(drafter, args.out)
    c = drafter.config
    shape = f"hidden {c.hidden_size}, draft vocab {c.draft_vocab_size}, aux layer ids {c.aux_layer_ids}"
    print(f"wrote a random EAGLE-3 drafter to {args.out} ({shape})")
    return 0
