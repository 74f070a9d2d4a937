"""The trainer's copy of the policy: micro-batched logprobs and one GRPO update per RL step.

Given an `UpdateCapture`, the update's forward also hands the harvester the aux hidden states (detached, copied out
row by row before the backward frees the graph) and soft labels of the rollouts it trains on: no second pass.
`update_dtype = "bfloat16"` runs the decoder layers in bf16 autocast; master weights, AdamW state, lm_head and logits
stay float32, so the PPO ratio's logprobs keep full precision.
"""

from __future__ import annotations

import contextlib
import time

import torch
from torch.nn.utils.rnn import pad_sequence

from gleanrl.base.batches import length_batches
from gleanrl.clients.rollout import Rollout
from gleanrl.harvest.capture import UpdateCapture, aux_hooks, samples_from
from gleanrl.trainer.config import TrainConfig
from gleanrl.trainer.grpo import group_advantages, logprob_mismatch, policy_loss, token_logprobs


class Policy:
    def __init__(self, cfg: TrainConfig, model_path: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one bar per save/load per step is noise
        self.cfg = cfg
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.model.eval()  # no dropout: training logprobs must match the server's
        self.ref = None
        if cfg.kl_coef > 0:  # the frozen reference is always the initial policy
            self.ref = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32).eval()
            self.ref.requires_grad_(False)
        self.bf16 = cfg.update_dtype == "bfloat16"
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay
        )

    def _batch(self, rollouts: list[Rollout]) -> dict[str, torch.Tensor]:
        """Right-padded [B, L] inputs; the response occupies positions P .. P+O-1 of each row."""
        pad = self.tokenizer.pad_token_id or 0

        def padded(rows: list[list], value: float, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return pad_sequence([torch.tensor(r, dtype=dtype) for r in rows], batch_first=True, padding_value=value)

        seqs, outs = [r.prompt_ids + r.output_ids for r in rollouts], [r.output_ids for r in rollouts]
        ids, attn, targets = padded(seqs, pad), padded([[1] * len(s) for s in seqs], 0), padded(outs, pad)
        mask = padded([[1.0] * len(o) for o in outs], 0.0, torch.float32)
        old = padded([r.rollout_logprobs for r in rollouts], 0.0, torch.float32)
        starts = torch.tensor([len(r.prompt_ids) for r in rollouts])
        return {"ids": ids, "attn": attn, "targets": targets, "mask": mask, "old": old, "starts": starts}

    def _logits(self, model, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """[B, L, V] float32 logits; with bf16 the layers run in autocast, the lm_head in float32."""
        if not self.bf16:
            return model(input_ids=b["ids"], attention_mask=b["attn"]).logits
        with torch.autocast(model.device.type, dtype=torch.bfloat16):
            hidden = model.base_model(input_ids=b["ids"], attention_mask=b["attn"]).last_hidden_state
        return model.get_output_embeddings()(hidden.float())

    def _logprobs(self, model, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._response_logprobs(self._logits(model, b), b)

    def _response_logprobs(self, logits: torch.Tensor, b: dict[str, torch.Tensor]) -> torch.Tensor:
        """logits [B, L, V] -> log p of each response token [B, T]."""
        resp_len = b["targets"].shape[1]
        # logits at position p predict token p + 1: the response's logits start at P - 1
        idx = (b["starts"] - 1)[:, None] + torch.arange(resp_len)[None]  # [B, T]
        idx = idx.clamp(max=logits.shape[1] - 1)
        resp_logits = logits.gather(1, idx[..., None].expand(-1, -1, logits.shape[-1]))  # [B, T, V]
        return token_logprobs(resp_logits, b["targets"], self.cfg.temperature)

    def _captured_forward(
        self, b: dict[str, torch.Tensor], rows: list[Rollout], capture: UpdateCapture | None
    ) -> tuple[torch.Tensor, float]:
        """The policy's logits [B, L, V], and the seconds spent capturing the rollouts `capture` wants."""
        want = [j for j, r in enumerate(rows) if capture is not None and capture.wants(r)]
        hooks = aux_hooks(self.model, capture.layer_ids) if want else contextlib.nullcontext({})
        with hooks as grabbed:
            logits = self._logits(self.model, b)
        if not want:
            return logits, 0.0
        t0 = time.perf_counter()
        prompt_lens = [len(rows[j].prompt_ids) for j in want]
        lens = [n + len(rows[j].output_ids) for n, j in zip(prompt_lens, want)]
        c = capture
        samples = samples_from(
            grabbed, logits, b["ids"], want, lens, prompt_lens, c.topk, c.policy_version, c.aux_dtype
        )
        grabbed.clear()  # the graph holds its own references until backward; ours go now
        for j, sample in zip(want, samples):
            capture.put(rows[j], sample)
        return logits, time.perf_counter() - t0

    def train_step(self, rollouts: list[Rollout], capture: UpdateCapture | None = None) -> dict:
        """One AdamW step on the rollouts, micro-batched, token-level normalisation; with `capture`, the
        harvester gets the hidden states of the rollouts it wants from this very forward."""
        cfg = self.cfg
        if not any(r.output_ids for r in rollouts):
            return self._zero_step()
        rewards = torch.tensor([float(r.reward) for r in rollouts])
        groups = torch.tensor([r.group_id for r in rollouts])
        adv = group_advantages(rewards, groups, scale=cfg.scale_advantages, negative_weight=cfg.negative_weight)
        num_tokens = max(sum(len(r.output_ids) for r in rollouts), 1)
        totals: dict[str, float] = {}
        self.optimizer.zero_grad(set_to_none=True)
        loss_total = capture_s = 0.0
        # micro-batches of like lengths: on doubling_checks group order padded ~1.9x the real tokens, sorted
        # micro-batches of 8 ~1.3x, with a token cap ~1.1x; the step is the same sum, in another float order
        lengths = [len(r.prompt_ids) + len(r.output_ids) if r.output_ids else 0 for r in rollouts]
        for rows in length_batches(lengths, cfg.micro_batch_size, cfg.micro_batch_tokens):
            b = self._batch([rollouts[i] for i in rows])
            chunk_adv = adv[rows]
            logits, spent = self._captured_forward(b, [rollouts[i] for i in rows], capture)
            capture_s += spent
            logp = self._response_logprobs(logits, b)
            ref_logp = None
            if self.ref is not None:
                with torch.no_grad():
                    ref_logp = self._logprobs(self.ref, b)
            mask = b["mask"]
            loss, stats = policy_loss(
                logp, b["old"], chunk_adv, mask, num_tokens, cfg.clip_low, cfg.clip_high, ref_logp, cfg.kl_coef
            )
            loss.backward()
            loss_total += loss.item()
            stats.update(logprob_mismatch(logp, b["old"], mask))
            for k, v in stats.items():
                totals[k] = max(totals.get(k, 0.0), v) if k.endswith("_max") else totals.get(k, 0.0) + v
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {
            "loss": loss_total,
            "grad_norm": grad_norm,
            "train_tokens": num_tokens,
            "adv_abs_mean": float(adv.abs().mean()) if len(adv) else 0.0,
            "clip_frac": totals.get("clip_frac_sum", 0.0) / num_tokens,
            "kl": totals.get("kl_sum", 0.0) / num_tokens,
            "logprob_mismatch": totals.get("mismatch_sum", 0.0) / num_tokens,
            "logprob_mismatch_max": totals.get("mismatch_max", 0.0),
            "update_capture_s": capture_s,
        }

    def _zero_step(self) -> dict:
        """The optimizer step of an update whose every advantage is 0, with no forward or backward: AdamW's
        momentum and weight decay still move the weights as they would."""
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        keys = "loss grad_norm adv_abs_mean clip_frac kl logprob_mismatch logprob_mismatch_max update_capture_s".split()
        return {k: 0.0 for k in keys} | {"train_tokens": 0}
