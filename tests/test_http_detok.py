"""Edge text handling without a server: incremental detokenization, stop trimming, stream deltas."""

from __future__ import annotations

from engine_util import finished_track
from gleanrl.server.http.generate.detok import Delta, Detokenizer, output_text


def test_incremental_decode_never_shows_half_characters_and_ends_exact(tiny_tokenizer):
    text = "héllo 😀 世界! ünïcode ✓ done"
    ids = tiny_tokenizer.encode(text)
    assert len(ids) > len(text) // 2  # multi-byte characters span several byte-level tokens
    detok, seen = Detokenizer(tiny_tokenizer, skip_special_tokens=True), []
    for k in range(1, len(ids) + 1):
        seen.append(detok(ids[:k], final=k == len(ids)))
    assert seen[-1] == tiny_tokenizer.decode(ids) == text
    assert all("\ufffd" not in s and text.startswith(s) for s in seen)
    assert any(len(s) < len(t) for s, t in zip(seen, seen[1:]))


def test_stop_string_and_stop_token_are_trimmed_unless_no_stop_trim(tiny_tokenizer):
    ids = tiny_tokenizer.encode("Answer: 42. Let us add")
    assert output_text(tiny_tokenizer, finished_track(ids, ". Let")) == "Answer: 42"
    assert output_text(tiny_tokenizer, finished_track(ids, ". Let"), no_stop_trim=True) == "Answer: 42. Let us add"
    last = ids[-1]
    trimmed = output_text(tiny_tokenizer, finished_track(ids, last))
    assert trimmed == tiny_tokenizer.decode(ids[:-1])


def test_delta_holds_back_a_possible_stop_prefix():
    delta = Delta(stop=["STOP"])
    parts = [delta("abc", False), delta("abcdefS", False), delta("abcdefST", False), delta("abcdef", True)]
    assert "".join(parts) == "abcdef" and "S" not in "".join(parts)
    plain = Delta(stop=[])
    assert plain("ab", False) + plain("abcd", False) + plain("abcd", True) == "abcd"
