"""Group drafts: the output tokens of a prompt's other samples propose continuations at no model cost.

GRPO runs each prompt n times at once and again in later steps, so the siblings that are ahead, and earlier steps'
samples, have often already written what a sequence is about to write. Per prompt (keyed by a hash of its exact token
ids, so every client gets it without an API change) an n-gram table maps the hash of each n-gram (min_n..max_n tokens)
of a sample to the positions that follow it, one int each (a hash collision only costs a rejected draft). `propose`
matches a sequence's last tokens, longest n first, and walks the continuations of the matching samples by majority vote,
as suffix decoding does (Oliaro et al., arXiv 2411.04975; ArcticInference, vLLM's `suffix` method): each drafted token
carries a probability estimate from the match counts, and the draft is extended while the estimate stays at or above
`min_prob`, up to `max_draft` tokens, per sequence (the controller then picks how much of it to verify,
`server/sd/controller.py`). The estimate: at depth j, of the v candidates that agree with the draft so far and reach
depth j, c vote for the majority token; its conditional estimate is the rule of succession (c + 1) / (v + 2) (one lone
sibling: 2/3 a token, all of 7: 8/9), the draft's the product. Simplified relative to suffix decoding: a bounded-order
n-gram table (matches of min_n..max_n tokens) instead of a suffix tree over whole samples, so a long match counts as
long as a max_n one; in Python a tree costs a node per token and depth, the table one int per token and n.

Bounds (all in `GroupIndexConfig`): the samples of the last `keep_versions` policy versions are kept; older finished
ones are dropped when a new version is set (running ones when they finish). All samples together hold at most
`max_tokens` output tokens (oldest finished samples go first, then the oldest running ones, which then stop being
indexed); each n-gram keeps its `max_hits` most recent positions. A dropped sample's table entries are skipped at lookup
and purged by rebuilding its group once they outnumber the live ones (amortised O(1) per token), so the table holds at
most about 2 x (max_n - min_n + 1) entries per live token. Measured with tracemalloc (defaults): about 170 bytes per
token on sibling-like samples, 340 on unrelated random ones, so the default bound (2^19 tokens) is 90-180 MB.

`GroupDrafts` keeps the index in step with the running sequences (`sync`, at the start of every decode iteration): a new
sequence starts a sample of its prompt, every sequence's output tokens emitted since the last iteration are indexed, and
a sequence that left the running set (finished, aborted) finishes its sample, whose tokens stay for its siblings and
later steps. A retracted or flushed sequence keeps its output ids, so its sample continues unchanged."""

from __future__ import annotations

import hashlib
import itertools
from array import array
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from gleanrl.server.sampling.sequence import Sequence

_POS_BITS = 32  # a table entry is (sample uid << _POS_BITS) | position: one int


def prompt_key(prompt_ids: list[int]) -> bytes:
    """A 16-byte digest of the exact prompt token ids (collisions only cost rejected drafts)."""
    return hashlib.blake2b(array("q", prompt_ids).tobytes(), digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class GroupIndexConfig:
    max_tokens: int = 1 << 19  # output tokens held over all prompts and versions
    keep_versions: int = 2  # policy versions whose samples are kept (the current one included)
    min_n: int = 2  # shortest n-gram that may propose
    max_n: int = 4
    # most recent positions kept per n-gram (siblings in lockstep add entries with nothing after them yet: room for
    # older samples too)
    max_hits: int = 64
    max_candidates: int = 16  # continuations a proposal votes over (the most recent useful ones)
    max_draft: int = 32  # longest draft
    min_prob: float = 0.1  # the draft stops before its estimate falls below this

    def __post_init__(self) -> None:
        for ok, rule in (
            (self.max_tokens >= 1, "max_tokens must be >= 1"),
            (self.keep_versions >= 1, "keep_versions must be >= 1"),
            (1 <= self.min_n <= self.max_n <= 16, "n-gram sizes must satisfy 1 <= min_n <= max_n <= 16"),
            (self.max_hits >= 1 and self.max_candidates >= 1, "max_hits and max_candidates must be >= 1"),
            (1 <= self.max_draft <= 32, "max_draft must be in [1, 32]"),
            (0.0 <= self.min_prob < 1.0, "min_prob must be in [0, 1)"),
        ):
            if not ok:
                raise ValueError(f"group index {rule}")


@dataclass(frozen=True, slots=True)
class GroupDraft:
    tokens: list[int]  # the proposed continuation (1..max_len tokens)
    match_len: int  # n of the matched n-gram
    candidates: int  # samples whose continuation matched
    support: list[int]  # support[j]: samples that agree with tokens[:j + 1]
    probs: list[float]  # probs[j]: conditional estimate that tokens[j] follows tokens[:j]


@dataclass(eq=False, slots=True)
class Sample:
    """One sample of a prompt: the prompt's last max_n tokens (context), then its output tokens."""

    key: bytes
    version: str
    tokens: list[int]
    context: int
    uid: int
    running: bool = True
    alive: bool = True
    entries: int = 0  # its n-gram table entries

    @property
    def output_len(self) -> int:
        return len(self.tokens) - self.context


@dataclass(eq=False, slots=True)
class _Group:
    table: dict[int, int | list[int]] = field(default_factory=dict)  # hash(n-gram) -> entry or entries
    samples: list[Sample] = field(default_factory=list)
    live: int = 0  # table entries of live samples
    dead: int = 0  # table entries of dropped samples


class GroupIndex:
    def __init__(self, config: GroupIndexConfig | None = None):
        self.config = config or GroupIndexConfig()
        self.groups: dict[bytes, _Group] = {}
        self.tokens = 0  # output tokens of live samples
        # eviction order: finished first, then running, oldest first
        self._finished: OrderedDict[Sample, None] = OrderedDict()
        self._running: OrderedDict[Sample, None] = OrderedDict()
        self._versions: list[str] = []
        self._live: dict[int, Sample] = {}  # uid -> live sample
        self._uids = itertools.count()

    def set_version(self, version: str) -> None:
        """A new policy version serves from now on; finished samples older than the last keep_versions go (running ones,
        which continue under the new version, go when they finish)."""
        if version in self._versions:
            return
        self._versions = (self._versions + [version])[-self.config.keep_versions :]
        for s in [s for s in self._finished if s.version not in self._versions]:
            self._drop(s)

    def start(self, prompt_ids: list[int], version: str) -> Sample:
        """Register a new running sample of the prompt; feed its tokens with `extend`."""
        self.set_version(version)
        key = prompt_key(prompt_ids)
        ctx = list(prompt_ids[-self.config.max_n :])
        s = Sample(key, version, ctx, len(ctx), next(self._uids))
        self._live[s.uid] = s
        self.groups.setdefault(key, _Group()).samples.append(s)
        self._running[s] = None
        return s

    def extend(self, s: Sample, new_tokens: list[int]) -> None:
        if not s.alive or not new_tokens:
            return
        start = len(s.tokens)
        s.tokens.extend(new_tokens)
        self.tokens += len(new_tokens)
        self._index(self.groups[s.key], s, start - 1 if start == s.context else start)
        while self.tokens > self.config.max_tokens:
            self._drop(next(iter(self._finished)) if self._finished else next(iter(self._running)))

    def finish(self, s: Sample) -> None:
        """The sample stopped: its tokens stay as drafts for its siblings and for later steps."""
        if s.alive and s.running:
            s.running = False
            del self._running[s]
            self._finished[s] = None
            if s.version not in self._versions:
                self._drop(s)

    def propose(self, key: bytes, recent: list[int], max_len: int | None = None) -> GroupDraft | None:
        """recent: the sequence's last tokens (prompt included). The majority continuation after the longest matching
        n-gram while its estimate stays >= min_prob, at most max_len (default max_draft) tokens, or None."""
        group, cfg = self.groups.get(key), self.config
        max_len = cfg.max_draft if max_len is None else min(max_len, cfg.max_draft)
        if group is None or max_len < 1:
            return None
        mask = (1 << _POS_BITS) - 1
        for n in range(min(cfg.max_n, len(recent)), cfg.min_n - 1, -1):
            hits = group.table.get(hash(tuple(recent[-n:])))
            if hits is None:
                continue
            conts, seen = [], set()
            for e in reversed(hits) if isinstance(hits, list) else (hits,):  # most recent first
                uid, pos = e >> _POS_BITS, e & mask
                s = self._live.get(uid)
                if s is not None and pos < len(s.tokens) and uid not in seen:
                    seen.add(uid)  # one position per sample
                    conts.append(s.tokens[pos : pos + max_len])
                    if len(conts) == cfg.max_candidates:
                        break
            if conts:
                return _majority(conts, n, max_len, cfg.min_prob)
        return None

    def stats(self) -> dict[str, int]:
        return {"prompts": len(self.groups), "samples": len(self._finished) + len(self._running), "tokens": self.tokens}

    def _index(self, group: _Group, s: Sample, first_end: int) -> None:
        """Index the n-grams ending at first_end.. (none in the prompt context: they would propose prompt tokens)."""
        cfg, toks, table = self.config, s.tokens, group.table
        for end in range(max(first_end, s.context - 1), len(toks)):
            entry = (s.uid << _POS_BITS) | (end + 1)
            for n in range(cfg.min_n, min(cfg.max_n, end + 1) + 1):
                hits = table.get(key := hash(tuple(toks[end - n + 1 : end + 1])))
                if hits is None:
                    table[key] = entry
                elif isinstance(hits, int):
                    table[key] = [hits, entry]
                else:
                    hits.append(entry)
                    if len(hits) > cfg.max_hits:
                        del hits[0]
                s.entries += 1
                group.live += 1

    def _drop(self, s: Sample) -> None:
        s.alive = False
        del self._live[s.uid]
        (self._running if s.running else self._finished).pop(s)
        self.tokens -= s.output_len
        group = self.groups[s.key]
        group.samples.remove(s)
        group.live, group.dead = group.live - s.entries, group.dead + s.entries
        if not group.samples:
            del self.groups[s.key]
        elif group.dead > group.live:  # purge the dropped entries
            fresh = self.groups[s.key] = _Group(samples=group.samples)
            for live in fresh.samples:
                live.entries = 0
                self._index(fresh, live, 0)


def _majority(conts: list[list[int]], n: int, max_len: int, min_prob: float) -> GroupDraft | None:
    """conts: candidate continuations (most recent first). Walk the most common token at each depth (ties: the most
    recent sample), keeping only the candidates that agree so far, while the product of the conditional estimates
    (c + 1) / (v + 2) stays >= min_prob."""
    candidates, tokens, support, probs, joint = len(conts), [], [], [], 1.0
    for j in range(max_len):
        voters = [c for c in conts if len(c) > j]
        if not voters:
            break
        first = voters[0][j]
        if all(c[j] == first for c in voters):
            tok, count = first, len(voters)
        else:
            tok, count = Counter(c[j] for c in voters).most_common(1)[0]
        p = (count + 1) / (len(voters) + 2)
        if joint * p < min_prob:
            break
        joint *= p
        tokens.append(tok)
        support.append(count)
        probs.append(p)
        conts = [c for c in voters if c[j] == tok]
    return GroupDraft(tokens, n, candidates, support, probs) if tokens else None


@dataclass(eq=False, slots=True)
class _Entry:
    sample: Sample
    key: bytes
    indexed: int = 0  # output tokens already indexed


class GroupDrafts:
    """The engine's side of the group index: synced with the running set, proposes drafts."""

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
