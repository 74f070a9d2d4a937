"""Batches of like lengths: right padding to a batch's longest row is wasted compute, and lengths can differ
10-30x (reasoning RL's siblings, a task's short and long problems)."""

from __future__ import annotations


def length_batches(lengths: list[int], max_rows: int = 0, max_tokens: int = 0) -> list[list[int]]:
    """The indices of the rows of length > 0, sorted by length (stable), in batches of at most `max_rows` rows and
    `max_tokens` padded tokens (rows x the batch's longest; a longer row alone); 0: no limit."""
    batches: list[list[int]] = []
    for i in sorted((i for i, n in enumerate(lengths) if n > 0), key=lengths.__getitem__):
        last = batches[-1] if batches else []
        if not last or len(last) == max_rows or (max_tokens and (len(last) + 1) * lengths[i] > max_tokens):
            batches.append(last := [])
        last.append(i)
    return batches
