"""Lossless speculative decoding (SD) in the embedded engine, with the EAGLE-3 drafter harvested during RL.

The pieces of the one decoder (`server/decode/sd_decoder.py`, `SDDecoder`; plain decoding is an empty draft, a chain is
a one-branch tree): the controller (`controller.py`) picks per sequence what to verify, `tree_pass.py` verifies every
tree in one target pass by one rule (`branch_verify.py`, the argument in its docstring); the drafts come from the
EAGLE-3 drafter (`draft.py`) and the prompt's other samples (`group_index.py`).

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
