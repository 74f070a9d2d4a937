"""Atomic step checkpoints. Step N lives in `OUT/weight_v{N}/`: a Hugging Face directory the rollout server loads
with `update_weights_from_disk`, plus `trainer_state.pt` (optimizer, step, RNG states), `train_config.json` and the
hooks' state (`hooks_state.pt`: the Harvester's drafter in training, optimizer, version). It appears by one rename, so
an existing directory is complete and its policy and drafter states belong together; `--resume` takes the highest N.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from gleanrl.base.atomic import atomic_dir, remove_stale_temporaries

_NAME = re.compile(r"^weight_v(\d+)$")
STATE_FILE = "trainer_state.pt"
HOOKS_FILE = "hooks_state.pt"


@dataclass(slots=True)
class Resumed:
    step: int
    path: Path
    optimizer_state: dict
    hooks_state: dict | None = None  # the rollout hooks' `state_dict()` saved with this step


def list_checkpoints(out: str | Path) -> list[tuple[int, Path]]:
    out = Path(out)
    if not out.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in out.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
    return sorted(found)


def save_checkpoint(
    out: str | Path,
    step: int,
    model,
    tokenizer,
    optimizer,
    config: dict,
    keep_last: int,
    hooks_state: dict | None = None,
) -> Path:
    """Write step `step` (with `hooks_state`) atomically, then delete all but the newest `keep_last` steps."""
    target = Path(out) / f"weight_v{step}"
    with atomic_dir(target) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
        torch.save({"step": step, "optimizer": optimizer.state_dict(), "rng": rng}, tmp / STATE_FILE)
        (tmp / "train_config.json").write_text(json.dumps(config, indent=2))
        if hooks_state is not None:
            torch.save(hooks_state, tmp / HOOKS_FILE)
    for old_step, path in list_checkpoints(out)[:-keep_last]:
        if old_step != step:
            shutil.rmtree(path, ignore_errors=True)
    return target


def load_latest(out: str | Path) -> Resumed | None:
    """The newest complete checkpoint, with the RNG states restored; None when there is none."""
    if Path(out).is_dir():
        remove_stale_temporaries(out)  # half-written checkpoints of the run that was killed
    for step, path in reversed(list_checkpoints(out)):
        state_file = path / STATE_FILE
        if not state_file.is_file():  # e.g. written by another tool; not ours to resume from
            continue
        state = torch.load(state_file, weights_only=False)
        if state.get("step") != step:
            raise ValueError(f"{state_file}: step {state.get('step')} does not match the directory name")
        random.setstate(state["rng"]["python"])
        torch.set_rng_state(state["rng"]["torch"])
        hooks = torch.load(path / HOOKS_FILE, weights_only=False) if (path / HOOKS_FILE).is_file() else None
        return Resumed(step=step, path=path, optimizer_state=state["optimizer"], hooks_state=hooks)
    return None
