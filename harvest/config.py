"""The harvest's settings (`HarvestConfig`, flags generated from its fields) and where a run keeps them:
`harvest_config.json` in its harvest root, beside spool/ and drafter_versions/, read by `--resume` and the sidecar.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from gleanrl.base.atomic import atomic_file
from gleanrl.base.flags import check_fields, flag
from gleanrl.harvest.spool import SpoolConfig

CONFIG_FILE = "harvest_config.json"


@dataclass(slots=True)
class HarvestConfig:
    topk: int = flag(32, "soft-label width kept per harvested token", name="drafter_topk")
    batch_size: int = flag(4, "harvested samples per drafter micro-step", name="drafter_batch_size")
    lr: float = flag(  # continual from the serving weights: 1e-3 first dips below a good warm start
        3e-4, "drafter AdamW learning rate (training continues from the serving weights)", name="drafter_lr"
    )
    ttt_length: int = 4  # unrolled draft steps, in training and in scoring
    max_tokens: int = flag(
        128,
        "window of each sample trained on and scored (0: whole samples; cost grows with its square)",
        name="drafter_max_tokens",
    )
    accept_mode: str = flag(
        "sampled",
        "held-out score: expected acceptance of speculative sampling ('sampled', rollouts at T=1) or the greedy chain "
        "('greedy')",
        choices=["sampled", "greedy"],
    )
    bf16: bool | None = None  # bf16 autocast in capture and training (None: where it pays)
    idle_nice: int = flag(
        0,
        "CPU priority (nice 0-19) of the drafter's idle-window thread; 19: it uses only compute nobody else wants, "
        "and starves on a busy machine",
    )
    push_every: int = flag(25, "drafter micro-steps between score-and-push attempts (0: never push)")
    min_gain: float = flag(
        0.02, "tokens per verify pass the paired gain's lower bound must clear to push (harvest.pushing)"
    )
    mid_step_gain: float = flag(0.3, "...to push inside a step, while rollouts run (else at the step boundary)")
    confidence_z: float = flag(2.0, "the push test's lower bound: gain - t(z, prompts - 1) * se")
    min_holdout_prompts: int = flag(4, "held-out prompts a push attempt needs")
    min_holdout_samples: int = flag(8, "held-out samples a push attempt needs")
    max_holdout: int = flag(48, "held-out samples (newest) scored per push attempt")
    holdout_versions: int = flag(4, "...from this many newest policy versions (1: the current one only)")
    keep_versions: int = flag(3, "pushed drafter versions kept on disk")
    aux_dtype: str = flag("float32", "spool storage of hidden states", choices=["float32", "bfloat16", "float16"])
    mid_step_capture: bool = False  # capture early finishers in the idle window (else: from the update)
    seed: int = 0
    versions_dir: str | None = None  # default: <spool_dir>/../drafter_versions
    spool: SpoolConfig = field(default_factory=SpoolConfig)

    def __post_init__(self) -> None:
        counts = ("topk", "batch_size", "ttt_length", "max_holdout", "holdout_versions", "keep_versions")
        check_fields(self, (*counts, "min_holdout_samples"))
        if self.lr <= 0 or self.push_every < 0 or self.min_gain < 0 or self.confidence_z < 0:
            raise ValueError("lr must be > 0, push_every, min_gain and confidence_z >= 0")
        if self.mid_step_gain < self.min_gain:
            raise ValueError(f"mid_step_gain must be >= min_gain ({self.min_gain}), got {self.mid_step_gain}")
        if self.min_holdout_prompts < 2:
            n = self.min_holdout_prompts
            raise ValueError(f"min_holdout_prompts must be >= 2 (a standard error needs two), got {n}")
        if not 0 <= self.idle_nice <= 19:
            raise ValueError(f"idle_nice must be in [0, 19], got {self.idle_nice}")
        if self.max_tokens < 0 or self.max_tokens in (1, 2):
            raise ValueError(f"max_tokens must be 0 (whole samples) or >= 3, got {self.max_tokens}")

    @classmethod
    def from_dict(cls, values: dict) -> HarvestConfig:
        return cls(**values | {"spool": SpoolConfig(**values.get("spool", {}))})


def write_config(root: Path, cfg: HarvestConfig) -> Path:
    """Store a run's harvest settings where `for_run` (and so `--resume`) reads them."""
    root.mkdir(parents=True, exist_ok=True)
    with atomic_file(root / CONFIG_FILE, "w") as f:
        json.dump(dataclasses.asdict(cfg), f, indent=2)
    return root / CONFIG_FILE


def read_config(root: Path) -> HarvestConfig:
    """The settings `write_config` stored under `root`; the defaults if none were."""
    path = root / CONFIG_FILE
    if not path.is_file():
        return HarvestConfig()
    try:
        return HarvestConfig.from_dict(json.loads(path.read_text()))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not valid harvest settings ({exc})") from None


def update_config(root: Path, given: dict, resume: bool) -> Path:
    """Store the resumed run's settings (else defaults) with `given` over them (by field; "spool.NAME")."""
    values = dataclasses.asdict(read_config(root) if resume else HarvestConfig())
    for key, value in given.items():
        table, name = (values["spool"], key[6:]) if key.startswith("spool.") else (values, key)
        table[name] = value
    return write_config(root, HarvestConfig.from_dict(values))
