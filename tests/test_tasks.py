"""Tasks and rewards: the built-in running-sums task, the math-answer reward, the JSONL loader and
loading a user task by dotted path."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from gleanrl.trainer.tasks import Doubling, JsonlTask, RunningSums, TaskError, accuracy, load_task
from gleanrl.trainer.tasks.builtin import build_char_tokenizer, chatml
from gleanrl.trainer.tasks.jsonl import extract_answer, math_reward
from gleanrl.trainer.tasks.measure import length_stats


def test_default_task_is_doubling_and_its_solution_is_rewarded():
    task = load_task(None)
    assert isinstance(task, Doubling) and isinstance(load_task("doubling"), Doubling)
    for sample in task.prompts("train", 50, seed=3):
        assert task.reward(sample, task.solution(sample)) == 1.0
        assert int(sample["answer"]) == sample["start"] * 2 ** sample["steps"] % 1000
        lines = task.solution(sample).split("\n")
        assert len(lines) == sample["steps"] + 2 and lines[1:-1] == sorted(lines[1:-1], reverse=True)


def test_running_sums_solution_is_rewarded():
    task = load_task("running_sums")
    for sample in task.prompts("train", 50, seed=3):
        assert task.reward(sample, task.solution(sample)) == 1.0
        assert int(sample["answer"]) == sum(sample["items"])


@pytest.mark.parametrize(
    "response, expected",
    [
        ("347\n02:694\n01:388\n\\boxed{388}", 1.0),
        ("\\boxed{388}", 1.0),  # only the boxed answer is checked
        ("347\n02:694\n01:389\n\\boxed{389}", 0.0),
        ("347\n02:694\n01:388\n", 0.0),  # no box
        ("\\boxed{0388}", 1.0),  # leading zeros compare by value
    ],
)
def test_doubling_reward(response, expected):
    assert Doubling().reward({"start": 347, "steps": 2, "answer": "388"}, response) == expected


@pytest.mark.parametrize(
    "response, expected",
    [
        ("a3=3 b5=8 c2=10 d8=18\n\\boxed{18}", 1.0),
        ("a3=3 b5=8 c2=10 d8=19\n\\boxed{19}", 0.0),  # wrong total
        ("\\boxed{ 18 }", 1.0),  # spaces are normalised away
        ("a3=3 b5=8 c2=10 d8=18", 0.0),  # no \boxed{}: the built-in task needs one
        ("a3=3 b5=8\n\\boxed{18", 0.0),  # unclosed
        ("\\boxed{}", 0.0),
        ("\\boxed{18}\n\\boxed{17}", 0.0),  # the last box counts
        ("", 0.0),
    ],
)
def test_running_sums_reward(response, expected):
    sample = {"items": [3, 5, 2, 8], "answer": "18"}
    assert RunningSums().reward(sample, response) == expected


@pytest.mark.parametrize("task", [Doubling(), RunningSums()], ids=["doubling", "running_sums"])
def test_prompts_are_deterministic_and_formatted_with_the_chat_template(task):
    a, b = task.prompts("train", 20, seed=1), task.prompts("train", 20, seed=1)
    assert a == b
    assert a != task.prompts("train", 20, seed=2)
    assert a != task.prompts("test", 20, seed=1)
    tokenizer = build_char_tokenizer()
    for sample in a:
        assert sample["prompt"] == tokenizer.apply_chat_template(
            sample["messages"], add_generation_prompt=True, tokenize=False
        )
        assert sample["prompt"] == chatml(sample["messages"][0]["content"])


@pytest.mark.parametrize("task", [Doubling(), RunningSums()], ids=["doubling", "running_sums"])
def test_reference_lengths_are_long_tailed_and_fit_the_context(task):
    tokenizer = build_char_tokenizer()
    samples = task.prompts("test", 2000, seed=0)
    lengths = [len(tokenizer(task.solution(s), add_special_tokens=False).input_ids) + 1 for s in samples]
    stats = length_stats(lengths)
    assert stats["p99_over_median"] >= 5
    assert stats["top5_share"] >= 0.25
    assert max(lengths) + max(len(s["prompt"]) for s in samples) <= 1024


def test_length_stats_on_a_known_list():
    stats = length_stats([10] * 95 + [100] * 5)
    assert stats["median"] == 10 and stats["p99"] == 100
    assert stats["top5_share"] == round(500 / 1450, 3)


def test_char_tokenizer_round_trips_text_and_special_tokens():
    tokenizer = build_char_tokenizer()
    text = chatml("sum: a3 b5") + "a3=3 b5=8\n\\boxed{8}<|im_end|>"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == text
    assert ids.count(tokenizer.eos_token_id) == 2 and len(tokenizer) == 100


@pytest.mark.parametrize(
    "response, reference, expected",
    [
        ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}", 1.0),
        ("They have 1,000 apples.", "1000", 1.0),  # last number when there is no box
        ("5 + 7 = 12. The answer is 12.", "#### 12", 1.0),  # GSM8K reference format
        ("\\boxed{$42$}", "42.0", 1.0),
        ("\\boxed{x^2+1}", "x^2 + 1", 1.0),
        ("\\boxed{13}", "12", 0.0),
        ("I do not know", "12", 0.0),
        # unclosed box: falls back to the last number
        ("\\boxed{12", "12", 1.0),
    ],
)
def test_math_reward(response, reference, expected):
    assert math_reward(response, reference) == expected


def test_extract_answer_handles_nested_braces():
    assert extract_answer("first \\boxed{1} then \\boxed{\\frac{a}{b}} done") == "\\frac{a}{b}"
    assert extract_answer("nothing here") is None


def test_jsonl_loader_skips_bad_lines_with_their_line_numbers(tmp_path, capsys):
    path = tmp_path / "data.jsonl"
    path.write_text(
        "\n".join(
            [
                json.dumps({"prompt": "What is 2+3?", "answer": 5}),
                "{not json",
                json.dumps({"prompt": "What is 10/4?", "answer": "2.5", "level": 1}),
                json.dumps({"answer": "1"}),
                "",
                json.dumps(["a list"]),
                json.dumps({"prompt": "Q", "answer": None}),
            ]
        )
        + "\n"
    )
    task = load_task(f"jsonl:{path}")
    assert isinstance(task, JsonlTask)
    samples = task.prompts("train", 5, seed=0)
    err = capsys.readouterr().err
    for lineno in (2, 4, 6, 7):
        assert f"data.jsonl:{lineno}:" in err
    assert "data.jsonl:1:" not in err and "data.jsonl:3:" not in err
    assert len(samples) == 5 and {s["line"] for s in samples} == {1, 3}
    by_line = {s["line"]: s for s in samples}
    assert task.reward(by_line[1], "2 + 3 = \\boxed{5}") == 1.0
    assert task.reward(by_line[3], "it is 2.50") == 1.0
    assert task.reward(by_line[3], "it is 2") == 0.0
    assert accuracy(task, [by_line[1], by_line[3]], ["\\boxed{5}", "\\boxed{3}"]) == 0.5


def test_jsonl_errors_are_clear(tmp_path):
    with pytest.raises(TaskError, match="does not exist"):
        load_task(str(tmp_path / "missing.jsonl")).prompts("train", 1, 0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("oops\n")
    with pytest.raises(TaskError, match="no usable records"):
        load_task(f"jsonl:{bad}").prompts("train", 1, 0)
    with pytest.raises(TaskError, match="train="):
        load_task("jsonl:train=a.jsonl,broken")


def test_jsonl_train_and_test_files(tmp_path):
    for split, answer in (("train", 1), ("test", 2)):
        (tmp_path / f"{split}.jsonl").write_text(json.dumps({"prompt": split, "answer": answer}) + "\n")
    task = load_task(f"jsonl:train={tmp_path / 'train.jsonl'},test={tmp_path / 'test.jsonl'}")
    assert task.prompts("test", 1, 0)[0]["answer"] == "2"
    assert task.prompts("train", 3, 0)[0]["answer"] == "1"


def test_load_user_task_by_dotted_path(tmp_path, monkeypatch):
    (tmp_path / "my_tasks.py").write_text(
        textwrap.dedent("""
        from gleanrl.trainer.tasks.base import Task

        class Echo(Task):
            def prompts(self, split, n, seed):
                return [{"prompt": f"say {i}", "answer": str(i)} for i in range(n)]
            def reward(self, sample, response):
                return float(response.strip() == sample["answer"])
        echo = Echo()
        not_a_task = 42
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in ("my_tasks:Echo", "my_tasks:echo"):
        task = load_task(spec)
        samples = task.prompts("train", 3, 0)
        assert [task.reward(s, s["answer"]) for s in samples] == [1.0, 1.0, 1.0]
    with pytest.raises(TaskError, match="not a task"):
        load_task("my_tasks:not_a_task")
    with pytest.raises(TaskError, match="no attribute"):
        load_task("my_tasks:missing")
    with pytest.raises(TaskError, match="cannot import"):
        load_task("no_such_module_xyz:task")
    with pytest.raises(TaskError, match="unknown task"):
        load_task("no_such_task")
    sys.modules.pop("my_tasks", None)


def test_self_checks_vary_a_groups_lengths_heavy_tailed_and_the_reward_ignores_them():
    task = load_task("doubling_checks")
    samples = task.prompts("train", 3000, seed=0)
    counts = [s["checks"] for s in samples]
    # geometric at 0.4 (capped): P(0) = 0.6, P(>= 1) = 0.4, P(>= 3) = 0.064
    assert 0.56 < counts.count(0) / len(counts) < 0.64
    assert 0.04 < sum(c >= 3 for c in counts) / len(counts) < 0.09 and max(counts) == task.max_checks
    for s in samples[:200]:
        sol = task.solution(s)
        assert task.reward(s, sol) == 1.0 and len(sol) <= task.max_chars
        assert sol.count("check\n") == s["checks"]
        # each derivation repeats the first; every choice point is 'c'heck or the box's '\'
        first = Doubling()._derivation(s["start"], s["steps"])
        assert sol == first + ("check\n" + first) * s["checks"] + f"\\boxed{{{int(s['answer']):03d}}}"
        choices = [sol[a:b] for a, b in task.solution_choices(s)]
        assert choices == ["c"] * s["checks"] + ["\\"]
    # what the policy samples: a check or not, the same reward
    s = dict(samples[0], checks=0)
    assert task.reward(s, task.solution(dict(s, checks=3))) == 1.0
    # no checks drawn where checks = 0: the default task's problems stay what they were
    assert "checks" not in load_task("doubling").prompts("train", 5, 0)[0]
    with pytest.raises(ValueError, match="checks"):
        Doubling(checks=1.0)
