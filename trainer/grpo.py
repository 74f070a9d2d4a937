"""GRPO math as pure tensor functions. B: sequences, T: response tokens (right-padded), V: vocab."""

from __future__ import annotations

import torch


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale: bool = True, eps: float = 1e-6, negative_weight: float = 1.0
) -> torch.Tensor:
    """A_i = (r_i - mean_g) / (std_g + eps) within each group (population std), negative ones times
    `negative_weight` (< 1: "PSR", Zhu et al. 2025, arXiv 2506.01347: sharpens faster, costs diversity).
    rewards, group_ids: [B] -> [B]. A group whose rewards are all equal gets 0."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    rewards = rewards.float()
    sums = torch.zeros(counts.numel()).index_add_(0, inverse, rewards)
    mean = (sums / counts)[inverse]  # [B]
    sq = torch.zeros(counts.numel()).index_add_(0, inverse, (rewards - mean) ** 2)
    std = (sq / counts).sqrt()[inverse]  # [B]
    adv = rewards - mean
    adv = adv / (std + eps) if scale else adv
    return torch.where(adv < 0, adv * negative_weight, adv)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log p(target) as SGLang 0.5.23 reports it (server/sampling/sampler.py): log_softmax(logits / temperature)
    before top-k / top-p / min-p; raw logits for greedy (T = 0). logits [B, T, V], targets [B, T] -> [B, T]."""
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token: exp(r) - r - 1, r = ref - logp. [B, T] -> [B, T]."""
    r = ref_logp - logp
    return torch.exp(r) - r - 1


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: int | float,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict]:
    """PPO-clipped policy gradient, ratio pi/pi_old (pi_old: the rollout logprobs), token-level normalised: the
    sum over valid tokens / `num_tokens`, the whole step's count (micro-batches sum). logp, old_logp, mask
    [B, T], advantages [B]. -> (loss, stats: floats summed over this micro-batch's tokens)."""
    mask = mask.float()
    adv = advantages.unsqueeze(-1)  # [B, 1]
    ratio = torch.exp(logp - old_logp)  # [B, T]
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)  # [B, T]
    kl = torch.zeros_like(per_token)
    if ref_logp is not None and kl_coef > 0:
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + kl_coef * kl
    loss = (per_token * mask).sum() / num_tokens
    with torch.no_grad():
        clip_frac = float(((clipped < unclipped).float() * mask).sum())  # clip active
        return loss, {"clip_frac_sum": clip_frac, "kl_sum": float((kl * mask).sum())}


def logprob_mismatch(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict:
    """Training vs inference logprobs of the same tokens, [B, T] each -> sum/max over valid tokens. Beyond float
    noise, the server and the trainer compute different distributions."""
    diff = (train_logp.detach() - rollout_logp).abs() * mask.float()
    return {"mismatch_sum": float(diff.sum()), "mismatch_max": float(diff.max()) if diff.numel() else 0.0}
