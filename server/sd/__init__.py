"""Lossless speculative decoding (SD) in the embedded engine, with the EAGLE-3 drafter harvested during RL.

The pieces of the one decoder (`server/decode/sd_decoder.py`, `SDDecoder`): plain decoding is an empty draft, a chain is
a one-branch tree. Per iteration the controller (`controller.py`: a cost model of target passes and drafter steps, and
acceptance estimates per source and depth) picks per sequence what to verify; `tree.py` + `tree_pass.py` verify every
sequence's tree (root + branches) in one target pass with one verifier (`branch_verify.py`: the point-mass /
speculative-sampling rule branch by branch; the argument in its docstring) and compact the caches to the accepted path.
Sources: `draft.py` (the EAGLE-3 drafter's chain; `drafter_forward.py`, `draft_state.py`; loaded by
`server/weights/drafter.py`) and group drafts (`group_index.py`: per prompt, the running and earlier samples' outputs,
adaptive-length drafts from match counts; `group_drafts.py` keeps it in step with the running set).
`server/model/verify_attention.py`: the batched attention of verify passes, one kernel per layer.

Simplified relative to TLT (arXiv 2511.16665, code mit-han-lab/fastrl), and why:
- Chain drafts, no top-k token tree (a tree has at most two branches: group and EAGLE-3). A chain needs no multi-path
  drafter bookkeeping, and on CPU with small batches captures most of the gain.
- Instead of TLT's bucketed bandit over draft lengths, a cost model: the rate each plan is expected to reach (tokens
  over measured seconds) is computed, not sampled, so there is no blind sweep of arms and plain decoding is played
  wherever nothing beats it. The acceptance estimates are kept across a drafter hot swap at half weight instead of TLT's
  fresh start per drafter: a new drafter is usually a slightly better copy of the old one.
- No CUDA graphs and no overlap of drafting with verification: each iteration drafts, then verifies all sequences in one
  target pass. Draft states are rebuilt by re-feeding the target at most `window` recent tokens after a drafter swap, a
  cache flush or a retraction.
- Sampled outputs are distributed exactly as without SD but are not the same samples for the same seed (SD consumes each
  request's generator differently, and the controller's choices depend on timing); greedy outputs are identical."""
