"""The demo report's time and SD fields, on known rows: pooled shares, tokens per target pass,
per-step columns, the expected answer beside the policy's."""

from __future__ import annotations

import pytest

from gleanrl.clients.rollout import Rollout
from gleanrl.demo_report import totals, write_report
from gleanrl.trainer.metrics import sd_stats, step_shares


def _row(step: int, rollout_s: float, tail_s: float, verify: int, sd_tokens: int, tokens: int) -> dict:
    row = {
        "step": step,
        "reward_mean": 0.5,
        "accuracy": 0.5,
        "rollout_s": rollout_s,
        "tail_s": tail_s,
        "train_s": 1.5,
        "push_s": 0.5,
        "idle_window_s": 4.0,
        "idle_used_s": 3.0,
        "spec_accept_length": sd_tokens / verify,
        "spec_verify_ct": verify,
        "spec_tokens": sd_tokens,
        "output_tokens": tokens,
        "target_passes": verify + tokens - sd_tokens,
        "tokens_per_pass": tokens / (verify + tokens - sd_tokens),
        "drafter_version": step,
    }
    return row | step_shares(row)


def test_sd_stats_and_shares():
    """3 verify passes accepting 5 drafts emit 8 of a's 10 tokens; SGLang's spec_accept_length (10
    / 3) is read from meta_info by no figure."""
    a = Rollout([1], group_id=0, index=0, sample={}, output_ids=list(range(10)))
    # plain
    b = Rollout([1], group_id=0, index=1, sample={}, output_ids=list(range(4)))
    a.apply(
        {
            "output_ids": a.output_ids,
            "meta_info": {
                "finish_reason": {"type": "stop"},
                "output_token_logprobs": [[-1.0, t, None] for t in a.output_ids],
                "spec_verify_ct": 3,
                "spec_accept_length": 10 / 3,
                "spec_accept_token_num": 5,
                "spec_draft_token_num": 12,
                "spec_accept_token_num_by_source": {"group": 4, "eagle": 1},
            },
        }
    )
    s = sd_stats([a, b])
    assert s["spec_accept_token_num_by_source"] == {"group": 4, "eagle": 1}
    assert (s["spec_verify_ct"], s["spec_tokens"], s["output_tokens"], s["target_passes"]) == (3, 8, 14, 9)
    assert s["spec_accept_length"] == pytest.approx(8 / 3) and s["tokens_per_pass"] == pytest.approx(14 / 9)
    assert sd_stats([b])["tokens_per_pass"] == 1.0
    sh = step_shares({"rollout_s": 6.0, "tail_s": 3.0, "train_s": 1.5, "push_s": 0.5})
    assert sh == {"step_s": 8.0, "rollout_share": 0.75, "tail_share": 0.5}


def test_report_fields(tmp_path):
    rows = [_row(1, 6.0, 3.0, 10, 30, 60), _row(2, 10.0, 6.0, 20, 70, 100)]
    t = totals(rows)
    assert t["rollout_share"] == pytest.approx(16 / 20) and t["tail_share"] == pytest.approx(9 / 16)
    assert t["idle_used_share"] == pytest.approx(0.75) and t["spec_accept_served"] == pytest.approx(100 / 30)
    assert t["tokens_per_pass"] == pytest.approx(160 / (30 + 160 - 100))
    assert t["sd_token_share"] == pytest.approx(100 / 160)
    closing = [
        {
            "question": "double 2 times, keep 3 digits: 001",
            "expected": "4",
            "answer": "001\n02:002\n01:004\n\\boxed{004}",
            "correct": True,
        },
        {
            "question": "double 0 times, keep 3 digits: 123",
            "expected": "123",
            "answer": "\\boxed{124}",
            "correct": False,
        },
    ]
    report = write_report(
        tmp_path, rows, [[3, 5], [7]], closing, {"weight_version": "2", "draft_weight_version": "2"}
    ).read_text()
    assert "1 of 2 right" in report and "expected `123`: wrong" in report
    assert "Rollouts took 80% of the step time, the long tail 56% of the rollouts" in report
    assert "the drafter used 75% of the idle window" in report and "3.33 tokens per verify pass" in report
    assert "1.78 output tokens per target pass" in report and "expected `4`" in report
    assert "no acceptance by source" in report
    rows[0]["spec_accept_token_num_by_source"], rows[1]["spec_accept_token_num_by_source"] = (
        {"group": 3, "eagle": 1},
        {"group": 3},
    )
    report = write_report(tmp_path, rows, [[3]], closing, {}).read_text()
    assert "Accepted draft tokens by source: eagle 14%, group 86%." in report
    table = [line for line in report.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1  # every row has the header's columns
    assert "| 6.00 | 75% | 3.00 | 50% | 3.00 | 75% | 3.00 | 0.00 | 1.50 | 1 |" in table[2]


def test_reference_summary_gives_the_paired_gain_and_its_z():
    from gleanrl.demo_report import reference_summary

    line = reference_summary({"n": 192, "initial": 0.5, "final": 0.6, "gain": 0.1, "gain_se": 0.05})
    assert "0.500 -> 0.600" in line and "+0.100 ± 0.050 (z = 2.0)" in line and "192 prompts" in line
    assert reference_summary(None) == ""
