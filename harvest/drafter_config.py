"""The EAGLE-3 drafter's config and its `config.json` in SGLang's format (`LlamaForCausalLMEagle3`).

Aux layer ids follow SGLang (`set_eagle3_layers_to_capture`): id `a` captures the residual stream *entering* target
layer `a + 1` (transformers' `output_hidden_states[a + 1]`). SGLang's default, [1, L//2 - 1, L - 4] (SpecForge's too),
ascending with duplicates collapsed, so ids must be strictly increasing; we always write them. EAGLE-3 uses three;
SGLang 0.5.23 sizes `fc` from the count, so 2- and 3-layer targets may have two (one would make SGLang skip `fc`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """SGLang/SpecForge's default ids; for shallow targets, where those collide, spread distinct ids."""
    if num_layers < 2:
        raise ValueError(f"an EAGLE-3 drafter needs a target with at least 2 layers, got {num_layers}")
    ids = [1, num_layers // 2 - 1, num_layers - 4]
    if ids[0] < ids[1] < ids[2]:
        return ids
    if num_layers <= 3:
        return [num_layers - 3, num_layers - 2]  # 2 layers: [-1, 0], -1 being the embedding output
    return [0, (num_layers - 2) // 2 if num_layers > 4 else 1, num_layers - 2]


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    return cfg.get(name, default) if isinstance(cfg, dict) else getattr(cfg, name, default)


def target_rope_theta(cfg: Any) -> float:
    rope = _get(cfg, "rope_parameters") or {}
    return float(_get(cfg, "rope_theta") or rope.get("rope_theta") or 10000.0)


@dataclass
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary (embedding, d2t/t2d range)
    draft_vocab_size: int  # rows of lm_head
    target_hidden_size: int
    target_num_hidden_layers: int | None  # not read by SGLang; lets load_drafter check the fit
    aux_layer_ids: list[int] = field(default_factory=list)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    hidden_act: str = "silu"

    def __post_init__(self) -> None:
        ids = self.aux_layer_ids
        if len(ids) < 2 or any(a >= b for a, b in zip(ids, ids[1:])):
            raise ValueError(f"aux_layer_ids must be 2 or more (EAGLE-3: 3) strictly increasing ids, got {ids}")
        n = self.target_num_hidden_layers
        if ids[0] < -1 or (n is not None and ids[-1] > n - 2):
            raise ValueError(f"aux_layer_ids {ids} out of range for a target with {n} layers (allowed -1..{n - 2})")
        if self.hidden_size != self.target_hidden_size:
            raise ValueError("the drafter shares the target's embedding, so hidden_size must equal target_hidden_size")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} must be in 1..{self.vocab_size}")
        if self.hidden_act != "silu":
            raise ValueError(f"only silu MLPs are supported, got {self.hidden_act}")

    @classmethod
    def for_target(
        cls, target: Any, aux_layer_ids: list[int] | None = None, draft_vocab_size: int | None = None
    ) -> DrafterConfig:
        """A one-layer drafter shaped like one layer of `target` (an HF config object or dict)."""
        hidden, heads = int(_get(target, "hidden_size")), int(_get(target, "num_attention_heads"))
        layers, vocab = int(_get(target, "num_hidden_layers")), int(_get(target, "vocab_size"))
        return cls(
            hidden_size=hidden,
            intermediate_size=int(_get(target, "intermediate_size")),
            num_attention_heads=heads,
            num_key_value_heads=int(_get(target, "num_key_value_heads") or heads),
            head_dim=int(_get(target, "head_dim") or hidden // heads),
            vocab_size=vocab,
            draft_vocab_size=draft_vocab_size or vocab,
            target_hidden_size=hidden,
            target_num_hidden_layers=layers,
            aux_layer_ids=list(aux_layer_ids or default_aux_layer_ids(layers)),
            rms_norm_eps=float(_get(target, "rms_norm_eps") or 1e-6),
            rope_theta=target_rope_theta(target),
            max_position_embeddings=int(_get(target, "max_position_embeddings") or 4096),
        )

    def to_json(self) -> dict:
        """SGLang's EAGLE-3 config.json (what SpecForge writes), ids explicit under `eagle_config`."""
        d = asdict(self)
        ids = d.pop("aux_layer_ids")
        return {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "num_hidden_layers": 1,
            **d,
            "attention_bias": False,
            "tie_word_embeddings": False,
            "rope_scaling": None,
            "torch_dtype": "float32",
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        }

    @classmethod
    def from_json(cls, d: dict) -> DrafterConfig:
        if "LlamaForCausalLMEagle3" not in (d.get("architectures") or []):
            raise ValueError(f"not an EAGLE-3 drafter config (architectures={d.get('architectures')})")
        if int(d.get("num_hidden_layers", 1)) != 1:
            raise ValueError("only one-layer EAGLE-3 drafters are supported")
        if d.get("rope_scaling"):
            raise ValueError(f"rope_scaling {d['rope_scaling']} is not supported")
        ids = (d.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if ids is None:
            raise ValueError("config.json has no eagle_config.eagle_aux_hidden_state_layer_ids")
        missing = [f for f in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size") if f not in d]
        if missing:
            raise ValueError(f"config.json is missing {missing}")
        kw = {f: d[f] for f in cls.__dataclass_fields__ if f != "aux_layer_ids" and d.get(f) is not None}
        kw.setdefault("head_dim", d["hidden_size"] // d["num_attention_heads"])
        kw.setdefault("num_key_value_heads", d["num_attention_heads"])
        kw.setdefault("draft_vocab_size", d["vocab_size"])
        kw.setdefault("target_hidden_size", d["hidden_size"])  # SpecForge omits it when equal
        kw.setdefault("target_num_hidden_layers", None)
        return cls(**kw, aux_layer_ids=[int(i) for i in ids])
