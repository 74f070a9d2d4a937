"""Capture a target's aux hidden states and next-token distributions, in the drafter's training layout: forward
pre-hooks on decoder layers a+1 record the residual stream entering them (SGLang's capture for aux layer id a),
concatenated in ascending order -> `aux_hidden` [T, n*H]; soft labels: softmax at T = 1, top-k (not renormalised;
row j predicts token j+1).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Protocol

import torch
from torch.nn.utils.rnn import pad_sequence


class FinishedRollout(Protocol):
    """What the harvest reads of a finished rollout (`clients.rollout.FinishedRollout` is one)."""

    prompt_ids: list[int]
    output_ids: list[int]

    @property
    def sd_tokens(self) -> int: ...


@dataclass
class Sample:
    input_ids: torch.Tensor  # [T] long
    aux_hidden: torch.Tensor  # [T, n*H], n = len(layer_ids) (EAGLE-3: 3)
    topk_ids: torch.Tensor  # [T, k] long
    topk_probs: torch.Tensor  # [T, k] float32
    loss_mask: torch.Tensor  # [T] bool: token j is to be learned (response tokens)
    policy_version: int | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors alone (what the spool stores)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "policy_version"}


@dataclass
class UpdateCapture:
    """The harvester's request to a policy update: capture the rollouts it `wants` from the update's forward
    (`aux_hooks` + `samples_from`) and `put` each Sample."""

    layer_ids: list[int]
    topk: int | None
    aux_dtype: torch.dtype | None
    policy_version: int
    wants: Callable[[FinishedRollout], bool]  # rollout -> take its states from this forward
    put: Callable[[FinishedRollout, Sample], None]  # once per wanted rollout, in the update's thread


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
    ids = pad_sequence(seqs, batch_first=True, padding_value=pad_id)
    mask = pad_sequence([torch.ones_like(s) for s in seqs], batch_first=True)
    return ids, mask, [int(s.numel()) for s in seqs]


def check_layer_ids(model: torch.nn.Module, layer_ids: list[int]) -> torch.nn.ModuleList:
    if sorted(set(layer_ids)) != list(layer_ids) or not layer_ids:
        raise ValueError(f"layer_ids must be strictly increasing, got {layer_ids}")
    layers = decoder_layers(model)
    if layer_ids[0] < -1 or layer_ids[-1] + 1 >= len(layers):
        raise ValueError(f"layer_ids {layer_ids} out of range for a {len(layers)}-layer model")
    return layers


@contextlib.contextmanager
def aux_hooks(model: torch.nn.Module, layer_ids: list[int]) -> Iterator[dict[int, torch.Tensor]]:
    """While open, each forward of `model` leaves the residual stream entering layer a+1 under key a
    (detached: the caller's graph keeps its own reference; this one must not outlive the batch)."""
    layers = check_layer_ids(model, layer_ids)
    grabbed: dict[int, torch.Tensor] = {}

    def hook_for(a: int):
        def hook(module, args, kwargs):
            grabbed[a] = (args[0] if args else kwargs["hidden_states"]).detach()

        return hook

    handles = [layers[a + 1].register_forward_pre_hook(hook_for(a), with_kwargs=True) for a in layer_ids]
    try:
        yield grabbed
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def samples_from(
    grabbed: dict[int, torch.Tensor],
    logits: torch.Tensor,
    ids: torch.Tensor,
    rows: list[int],
    lens: list[int],
    prompt_lens: list[int] | None,
    topk: int | None,
    policy_version: int | None,
    aux_dtype: torch.dtype | None = None,
) -> list[Sample]:
    """Samples of batch rows `rows` (right-padded, `lens[i]` tokens) from one forward's aux states [B, L, H] per
    layer and logits [B, L, V], row by row (one row's soft labels at a time)."""
    out = []
    for i, (b, n) in enumerate(zip(rows, lens)):
        aux = torch.cat([grabbed[a][b, :n] for a in sorted(grabbed)], dim=-1).cpu()  # [T, n*H], a copy
        aux = aux.to(aux_dtype) if aux_dtype is not None else aux
        probs = torch.softmax(logits[b, :n].detach().float(), dim=-1).cpu()  # [T, V]
        top_p, top_i = probs.topk(probs.shape[-1] if topk is None else min(topk, probs.shape[-1]), dim=-1)
        loss_mask = torch.ones(n, dtype=torch.bool)
        if prompt_lens is not None:
            loss_mask[: prompt_lens[i]] = False
        out.append(Sample(ids[b, :n].cpu().clone(), aux, top_i, top_p, loss_mask, policy_version))
    return out


@torch.no_grad()
def capture(
    model: torch.nn.Module,
    input_ids: torch.Tensor | list,
    layer_ids: list[int],
    topk: int | None = 64,
    prompt_lens: list[int] | None = None,
    policy_version: int | None = None,
    aux_dtype: torch.dtype | None = None,
    bf16: bool = False,
) -> list[Sample]:
    """input_ids: [B, T] or 1-D sequences (right-padded here); `prompt_lens[b]`: tokens not to learn; topk None:
    the whole distribution; `bf16`: autocast (states as a bf16 server computes them). -> one Sample each."""
    device = next(model.parameters()).device
    ids, mask, lens = _pad(input_ids, 0)
    with aux_hooks(model, layer_ids) as grabbed:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
    rows = list(range(len(lens)))
    return samples_from(grabbed, logits, ids, rows, lens, prompt_lens, topk, policy_version, aux_dtype)
