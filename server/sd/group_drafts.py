"""The engine's side of the group index: keeps it in step with the running sequences and proposes drafts.

`sync` runs at the start of every decode iteration: a new sequence starts a sample of its prompt, every sequence's
output tokens emitted since the last iteration are indexed, and a sequence that left the running set (finished, aborted)
finishes its sample, whose tokens stay for its siblings and later steps. A retracted or flushed sequence keeps its
output ids, so its sample continues unchanged."""

from __future__ import annotations

from dataclasses import dataclass

from gleanrl.server.sampling.sequence import Sequence
from gleanrl.server.sd.group_index import GroupDraft, GroupIndex, GroupIndexConfig, Sample, prompt_key


@dataclass(eq=False, slots=True)
class _Entry:
    sample: Sample
    key: bytes
    indexed: int = 0  # output tokens already indexed


class GroupDrafts:
    def __init__(self, config: GroupIndexConfig | None = None):
        self.index = GroupIndex(config)
        self._entries: dict[Sequence, _Entry] = {}  # Sequence hashes by identity

    def sync(self, seqs: list[Sequence], version: str) -> None:
        live = set(seqs)
        for s in [s for s in self._entries if s not in live]:
            self._extend(s, self._entries[s])  # its last tokens, then it finishes
            self.index.finish(self._entries.pop(s).sample)
        self.index.set_version(version)
        for s in seqs:
            e = self._entries.get(s)
            if e is None:
                e = self._entries[s] = _Entry(self.index.start(s.req.input_ids, version), prompt_key(s.req.input_ids))
            self._extend(s, e)

    def _extend(self, s: Sequence, e: _Entry) -> None:
        if len(s.output_ids) > e.indexed:
            self.index.extend(e.sample, s.output_ids[e.indexed :])
            e.indexed = len(s.output_ids)

    def propose(self, s: Sequence, max_len: int) -> GroupDraft | None:
        """The continuation of s's last tokens (its prompt's tail included) by its group, up to max_len."""
        e = self._entries.get(s)
        if e is None or max_len < 1:
            return None
        return self.index.propose(e.key, s.tokens(max(s.total_len - self.index.config.max_n, 0), s.total_len), max_len)

    def stats(self) -> dict[str, int]:
        return self.index.stats()
