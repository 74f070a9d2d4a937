"""TrainConfig: one validated dataclass, filled from a TOML/YAML file and then from flags (those of
its fields with `flag()`, `base.flags`)."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from gleanrl.base.flags import check_fields, flag


@dataclass(slots=True)
class TrainConfig:
    model: str = flag(help="initial policy (Hugging Face directory)")
    out: str = flag(help="output directory: checkpoints weight_v{N}, metrics.jsonl, resolved config")
    task: str | None = flag(
        None, "built-in task name, jsonl:PATH or module:object (default: the built-in task)", exclusive="source"
    )
    data: str | None = flag(None, "JSONL prompt file instead of a task", exclusive="source")
    servers: list[str] = flag(
        help="a running rollout server (repeat for several); default: start an embedded one",
        name="server",
        metavar="URL",
        default_factory=list,
    )
    router: str | None = flag(
        None,
        "send generation through this router (sglang-router); weight updates still go to every --server worker",
        metavar="URL",
    )
    drafter: str | None = flag(
        None,
        "EAGLE-3 drafter: harvest on (hidden states of finished rollouts train it while the step waits on its "
        "tail; better versions are pushed to the servers); the embedded server serves it with --sd adaptive; "
        "state in OUT/harvest",
        metavar="DIR",
    )
    steps: int = flag(20, "RL steps")
    prompts_per_step: int = flag(8, "prompts per step")
    samples_per_prompt: int = flag(4, "rollouts per prompt (GRPO group size)")
    max_new_tokens: int = flag(64, "rollout length cap")
    temperature: float = flag(1.0, "sampling temperature")
    top_p: float = flag(1.0, "top-p (< 1: nucleus sampling; logprobs stay of the full softmax)")
    lr: float = flag(1e-4, "AdamW learning rate")
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    micro_batch_size: int = flag(8, "sequences per forward/backward at most")
    # on CPU a micro-batch's activations should stay near the cache: the deep policy's update ran 1.6x faster at
    # 1024 than at 4096 (2-core AVX2 EPYC, 2026-12-07: 1.8 against 2.9 ms per token; 512-2048 within 10 % of 1024)
    micro_batch_tokens: int = flag(
        1024, "padded tokens per forward/backward at most (rows sorted by length; a longer one alone; 0: no limit)"
    )
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = flag(0.0, "k3 KL to the initial policy (0: off; > 0 keeps a frozen reference copy of it)")
    scale_advantages: bool = True  # divide by the group std (GRPO) or not (Dr. GRPO)
    negative_weight: float = flag(
        1.0, "weight of negative advantages (< 1 leans on reinforcing successes; the demo uses 1)"
    )
    eval_every: int = flag(0, "accuracy on held-out prompts at step 0, every N steps and the last (0: off)")
    eval_prompts: int = flag(64, "held-out prompts per evaluation")
    eval_samples: int = flag(1, "samples per held-out prompt (> 1 only with --eval-temperature)")
    eval_temperature: float = flag(0.0, "evaluation temperature (0: greedy)")
    eval_greedy: bool = flag(False, "also evaluate greedily (eval_greedy_* keys; with eval_temperature > 0)")
    keep_last: int = flag(2, "step checkpoints kept")
    seed: int = flag(0, "seed")
    trainer_threads: int = flag(1, "torch threads of the trainer")
    update_threads: int = flag(
        0, "torch threads of the policy update, which runs while the servers wait (0: one per core)"
    )
    update_cores: list[int] = field(default_factory=list)  # CPU affinity of the update (empty: unchanged)
    update_dtype: str = flag(
        "float32",
        "the policy update's compute dtype: float32, or bfloat16 autocast (fp32 master weights, optimizer and "
        "logits; 3-4x faster on CPUs with AVX-512 BF16)",
        choices=["float32", "bfloat16"],
    )
    replicas: int = flag(
        0,
        "embedded rollout servers, each pinned to its share of the cores (0: with --drafter on CPU one per core, the "
        "harvest training on the cores of replicas that finished; else one server on every core; 1: one server, on "
        "half the cores with --drafter)",
    )
    server_threads: int = flag(0, "torch threads of each embedded server (0: one per core of its share)")
    serve: dict = field(default_factory=dict)  # embedded server's `gleanrl serve` settings by name (its --config)
    api_key: str | None = flag(None, "the rollout server's API key")
    admin_api_key: str | None = flag(None, "the rollout server's admin API key (weight updates)")
    request_timeout_s: float = 600.0
    server_wait_s: float = flag(120.0, "how long to wait for a dead or restarting server")
    max_attempts: int = 3  # submissions per rollout before it counts as failed
    stream: bool = True  # stream /generate to time the first token
    stream_interval: int = 8  # tokens per streamed chunk (first-token time is that coarse)

    def __post_init__(self) -> None:
        if isinstance(self.servers, str):
            self.servers = [self.servers]
        self.betas = tuple(self.betas)
        counts = "steps prompts_per_step samples_per_prompt max_new_tokens micro_batch_size keep_last eval_prompts"
        counts += " eval_samples trainer_threads max_attempts stream_interval"
        check_fields(self, tuple(counts.split()))
        checks = [
            ("server_threads", isinstance(self.server_threads, int) and self.server_threads >= 0, "must be >= 0"),
            ("micro_batch_tokens", self.micro_batch_tokens >= 0, "must be >= 0"),
            ("replicas", isinstance(self.replicas, int) and self.replicas >= 0, "must be >= 0"),
            ("temperature", self.temperature > 0, "must be > 0 (GRPO needs sampled rollouts)"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("eval_temperature", self.eval_temperature >= 0, "must be >= 0"),
            ("lr", self.lr > 0, "must be > 0"),
            ("grad_clip", self.grad_clip > 0, "must be > 0"),
            ("negative_weight", self.negative_weight >= 0, "must be >= 0"),
            ("clip_low", 0 <= self.clip_low < 1, "must be in [0, 1)"),
            ("clip_high", self.clip_high >= 0, "must be >= 0"),
            ("kl_coef", self.kl_coef >= 0, "must be >= 0"),
            ("weight_decay", self.weight_decay >= 0, "must be >= 0"),
            ("request_timeout_s", self.request_timeout_s > 0, "must be > 0"),
            ("server_wait_s", self.server_wait_s > 0, "must be > 0"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"{name} {why}, got {getattr(self, name)!r}")
        if not (Path(self.model) / "config.json").is_file():
            raise ValueError(f"model must be a Hugging Face model directory (with config.json), got {self.model!r}")
        if not isinstance(self.update_threads, int) or self.update_threads < 0:
            raise ValueError(f"update_threads must be an integer >= 0 (0: one per core), got {self.update_threads!r}")
        self.update_cores = list(self.update_cores)
        if not all(isinstance(c, int) and c >= 0 for c in self.update_cores):
            raise ValueError(f"update_cores must be core numbers >= 0, got {self.update_cores!r}")
        if not isinstance(self.eval_every, int) or self.eval_every < 0:
            raise ValueError(f"eval_every must be an integer >= 0, got {self.eval_every!r}")
        if self.drafter is not None:
            from gleanrl.harvest.checkpoint import check_drafter_dir

            check_drafter_dir(self.drafter)
        if self.router is not None and not self.servers:
            why = "weight updates go to every worker, the router only forwards generation"
            raise ValueError(f"router needs the worker URLs too (--server URL per worker): {why}")
        if not isinstance(self.serve, dict):
            raise ValueError(f"serve must be a table of `gleanrl serve` settings, got {self.serve!r}")
        if self.task and self.data:
            raise ValueError("give either task or data, not both")

    def to_dict(self) -> dict:
        """The fields as written to config.resolved.json and every checkpoint: keys are never written."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return out | {k: "<redacted>" for k in ("api_key", "admin_api_key") if out[k]}


def read_config_file(path: str | Path) -> dict:
    """A flat table of TrainConfig fields from .toml, .yaml/.yml or .json."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file not found: {path}")
    text = path.read_text()
    if path.suffix == ".toml":
        data = tomllib.loads(text)
    elif path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text) or {}
    elif path.suffix == ".json":
        data = json.loads(text)
    else:
        raise ValueError(f"config file must be .toml, .yaml, .yml or .json, got {path.name}")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a table of settings")
    return data


def build_config(file_values: dict, flag_values: dict) -> TrainConfig:
    """File first, then flags that were given (None means not given)."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(file_values) - known)
    if unknown:
        raise ValueError(f"unknown config keys: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    values = dict(file_values)
    values.update({k: v for k, v in flag_values.items() if v is not None and k in known})
    for required in ("model", "out"):
        if not values.get(required):
            raise ValueError(f"{required} is required (flag --{required} or the config file)")
    return TrainConfig(**values)


def write_resolved(cfg: TrainConfig, out: str | Path) -> Path:
    from gleanrl.base.atomic import atomic_file

    target = Path(out) / "config.resolved.json"
    with atomic_file(target, "w") as f:
        json.dump(cfg.to_dict(), f, indent=2)
    return target
