"""GroupDrafts follows the running set: new sequences start samples, emitted tokens are indexed,
leavers finish theirs (kept for siblings and later steps)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from gleanrl.server.sd.group_index import GroupDrafts, GroupIndexConfig


@dataclass(eq=False)
class _Seq:
    prompt: list[int]
    output_ids: list[int] = field(default_factory=list)

    @property
    def req(self):
        return SimpleNamespace(input_ids=self.prompt)

    @property
    def total_len(self) -> int:
        return len(self.prompt) + len(self.output_ids)

    def tokens(self, start, end):
        return (self.prompt + self.output_ids)[start:end]


def test_siblings_draft_for_each_other_and_finished_samples_stay():
    g = GroupDrafts(GroupIndexConfig(keep_versions=1))
    a, b, other = _Seq([1, 2, 3]), _Seq([1, 2, 3]), _Seq([9, 9])
    g.sync([a, b, other], "v0")
    assert g.propose(b, 4) is None
    a.output_ids += [10, 11, 12, 13]
    g.sync([a, b, other], "v0")
    assert g.propose(b, 3).tokens == [10, 11, 12] and g.propose(other, 3) is None
    b.output_ids += [10, 11]
    # its last iteration's token, then it finishes
    a.output_ids += [14]
    g.sync([b, other], "v0")
    assert g.propose(b, 3).tokens == [12, 13, 14]
    later = _Seq([1, 2, 3])  # the same prompt, a later step
    g.sync([later], "v0")
    assert g.propose(later, 2).tokens == [10, 11] and g.index.stats()["samples"] == 4
    # a new policy version: v0's samples age out
    g.sync([later], "v1")
    assert g.propose(later, 2) is None and g.index.stats()["samples"] == 1
