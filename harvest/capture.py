"""Capture a target's aux hidden states and next-token distributions, in the drafter's training layout.

Forward pre-hooks on the target's decoder layers a+1, b+1, c+1 record the residual stream entering them
(SGLang's capture for `eagle_aux_hidden_state_layer_ids` = [a, b, c], transformers'
`output_hidden_states[a+1]`...), concatenated in ascending layer order -> `aux_hidden` [T, n*H].
Soft labels: the target's softmax at temperature 1, top-k (ids sorted by probability, probs not
renormalised; row j predicts token j+1).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Sample:
    input_ids: torch.Tensor       # [T] long
    aux_hidden: torch.Tensor      # [T, n*H], n = len(layer_ids) (EAGLE-3: 3)
    topk_ids: torch.Tensor        # [T, k] long
    topk_probs: torch.Tensor      # [T, k] float32
    loss_mask: torch.Tensor       # [T] bool: token j is to be learned (response tokens)
    policy_version: int | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors alone (what the spool stores)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "policy_version"}

    @classmethod
    def from_tensors(cls, d: dict[str, torch.Tensor], policy_version: int | None = None) -> "Sample":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name != "policy_version"},
                   policy_version=policy_version)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    inner = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__}")
    return layers


def _pad(input_ids: torch.Tensor | list, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    if isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2:
        return input_ids, torch.ones_like(input_ids), [input_ids.shape[1]] * input_ids.shape[0]
    seqs = [torch.as_tensor(s, dtype=torch.long) for s in input_ids]
    lens = [int(s.numel()) for s in seqs]
    ids = torch.full((len(seqs), max(lens)), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, s in enumerate(seqs):
        ids[b, :lens[b]], mask[b, :lens[b]] = s, 1
    return ids, mask, lens


@torch.no_grad()
def capture(model: torch.nn.Module, input_ids: torch.Tensor | list, layer_ids: list[int], topk: int | None = 64,
            prompt_lens: list[int] | None = None, policy_version: int | None = None,
            aux_dtype: torch.dtype | None = None, bf16: bool = False) -> list[Sample]:
    """input_ids: [B, T] or a list of 1-D sequences (right-padded here). `prompt_lens[b]`: tokens of
    sequence b not to learn (loss_mask False). topk None: the whole distribution. `bf16`: the forward
    under bf16 autocast (hidden states as a bf16 server computes them). -> one Sample each."""
    if sorted(set(layer_ids)) != list(layer_ids) or not layer_ids:
        raise ValueError(f"layer_ids must be strictly increasing, got {layer_ids}")
    layers = decoder_layers(model)
    if layer_ids[0] < -1 or layer_ids[-1] + 1 >= len(layers):
        raise ValueError(f"layer_ids {layer_ids} out of range for a {len(layers)}-layer model")
    device = next(model.parameters()).device
    ids, mask, lens = _pad(input_ids, 0)
    grabbed: dict[int, torch.Tensor] = {}

    def hook_for(i: int):
        def hook(module, args, kwargs):
            grabbed[i] = args[0] if args else kwargs["hidden_states"]
        return hook

    handles = [layers[a + 1].register_forward_pre_hook(hook_for(a), with_kwargs=True) for a in layer_ids]
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
    finally:
        for h in handles:
            h.remove()
    aux = torch.cat([grabbed[a] for a in layer_ids], dim=-1).cpu()          # [B, T, 3H]
    if aux_dtype is not None:
        aux = aux.to(aux_dtype)
    probs = torch.softmax(logits.float(), dim=-1).cpu()                     # [B, T, V]
    k = probs.shape[-1] if topk is None else min(topk, probs.shape[-1])
    top_p, top_i = probs.topk(k, dim=-1)
    out = []
    for b, n in enumerate(lens):
        loss_mask = torch.ones(n, dtype=torch.bool)
        if prompt_lens is not None:
            loss_mask[: prompt_lens[b]] = False
        out.append(Sample(ids[b, :n].clone(), aux[b, :n].clone(), top_i[b, :n].clone(), top_p[b, :n].clone(),
                          loss_mask, policy_version))
    return out
