"""Lossless speculative decoding (SD) in the embedded engine, with the EAGLE-3 drafter harvested during RL.

Files: `decoder.py` (the SD decode iteration, a drop-in for `server.decode.PlainDecoder`), `draft.py`
(the drafter proposes a chain of k tokens per sequence), `verify.py` (the acceptance rule as pure
tensor math), `verify_batch.py` (one batched verify call per iteration over the ragged batch),
`policy.py` (when to speculate and how far), `draft_state.py` (the target hidden states each sequence's
drafter has not consumed), `drafter_forward.py` (the drafter's forward over per-sequence KV caches),
`drafter_load.py` (loading a drafter for the serving target; building the decoder).
Group drafts (the prompt's other running and earlier samples as free drafts, fused with EAGLE-3):
`group_index.py` (per-prompt n-gram index, bounded and aged by policy version), `group_drafts.py` (kept
in step with the running set), `source_policy.py` (the bandit's arms: plain / eagle / group / fused),
`tree.py` + `tree_pass.py` (root + branches in one target pass; cache compaction to the accepted path),
`branch_verify.py` (the point-mass / speculative-sampling rule branch by branch), `verify_attention.py`
(one batched attention kernel per layer for verify passes), `fused_decoder.py` (the decode iteration).

Simplified relative to TLT (arXiv 2511.16665, code mit-han-lab/fastrl), and why:
- Chain drafts, no top-k token tree (the fused arm's tree is two chains from one root: group and
  EAGLE-3). TLT (on SGLang's EAGLE-3) drafts a tree (top-k per step) and verifies it with tree
  attention. A chain needs no multi-path cache bookkeeping, keeps the losslessness proof the textbook
  one (`verify.py`), and on CPU with small batches captures most of the gain; a tree raises acceptance
  per pass at the price of that machinery.
- The adaptive policy's arms are chain draft lengths (0 = plain decoding) per batch-size bucket;
  TLT's bucketed bandit also varies the tree's top-k and the number of verified tokens. SD runs only
  while at most `sd_max_batch` requests run (default 8; TLT: fewer than 32 on GPUs, where the target
  stays memory-bound at larger batches than on a CPU).
- The bandit keeps its knowledge across a drafter hot swap, decayed toward the table prior
  (`SDPolicy.decay`), instead of TLT's fresh start per drafter: a new drafter is usually a slightly
  better copy of the old one, so the old ranking is a good prior that new measurements soon override.
- No CUDA graphs and no overlap of drafting with verification: each iteration drafts, then verifies
  all sequences in one target pass. Draft states are rebuilt by re-feeding the target at most
  `window` recent tokens after a drafter swap, a cache flush or a retraction, rather than kept
  across them.
- Sampled outputs are distributed exactly as without SD but are not the same samples for the same
  seed (SD consumes each request's generator differently); greedy outputs are identical.
"""
