"""The records that cross the trainer ↔ harvest ↔ sidecar ↔ server seam: the ground of the import
rule, which every component may import and which imports nothing of the project. A finished rollout
with SGLang's `meta_info` names, a drafter version's directory, the Task plug-in's base class."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# what a harvest feed record carries of a /generate answer's meta_info, besides the weight version
FEED_META = ("spec_verify_ct", "spec_accept_length", "spec_accept_token_num", "draft_weight_version")
_VERSION_DIR = re.compile(r"^v(\d+)$")


@dataclass(slots=True)
class FinishedRollout:
    """What the harvest takes of a finished rollout: `clients.rollout.Rollout` is one, the sidecar
    reads one from each feed record."""
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    weight_version: str | None = None
    draft_weight_version: str | None = None
    spec_verify_ct: int = 0               # SD verify passes
    spec_accept_token_num: int = 0        # draft tokens those passes accepted
    # gleanrl: accepted drafts per source
    spec_accept_token_num_by_source: dict[str, int] = field(default_factory=dict)

    @property
    def sd_tokens(self) -> int:
        """Output tokens from verify passes: each emits the drafts it accepted and one of its own."""
        return self.spec_verify_ct + self.spec_accept_token_num

    def read_meta(self, meta: dict) -> FinishedRollout:
        """Versions and SD counters from a /generate answer's `meta_info` (or a feed record)."""
        self.weight_version = _str_or_none(meta.get("weight_version"))
        self.draft_weight_version = _str_or_none(meta.get("draft_weight_version"))
        self.spec_verify_ct = int(meta.get("spec_verify_ct") or 0)
        self.spec_accept_token_num = int(meta.get("spec_accept_token_num") or 0)
        by_source = meta.get("spec_accept_token_num_by_source") or {}
        self.spec_accept_token_num_by_source = {str(k): int(v) for k, v in by_source.items()}
        return self


def drafter_dir(versions_dir: Path, version: int) -> Path:
    """Where pushed drafter version N lives (its `draft_weight_version` is str(N))."""
    return Path(versions_dir) / f"v{version:06d}"


def drafter_versions(versions_dir: Path) -> list[tuple[int, Path]]:
    """The drafter versions under `versions_dir`, oldest first."""
    return sorted((int(m[1]), p) for p in Path(versions_dir).glob("v*")
                  if (m := _VERSION_DIR.match(p.name)))


class Task:
    """The plug-in the RL loop trains on (`trainer.tasks.load_task`): subclass it and define
    `prompts` (records holding "prompt", the text sent to /generate, and what `reward` needs) and
    `reward` (1.0 = correct); the other methods have defaults."""

    def prompts(self, split: str, n: int, seed: int) -> list[dict]:
        raise NotImplementedError

    def reward(self, sample: dict, response: str) -> float:
        raise NotImplementedError

    def correct(self, sample: dict, response: str, reward: float) -> bool:
        return reward >= 1.0  # what the eval metrics count as correct

    def solution(self, sample: dict) -> str | None:
        return None  # the reference solution (bootstrap's SFT, `gleanrl measure`); None: none

    def solution_focus(self, sample: dict) -> list[tuple[int, int]]:
        return []  # character spans of `solution(sample)` that SFT weighs by `focus_weight`


def _str_or_none(value) -> str | None:
    return None if value is None else str(value)
