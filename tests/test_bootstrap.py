"""`gleanrl bootstrap` at the tiny size: a loadable, cached, deterministic Hugging Face model
directory whose policy has learned the task's format."""

from __future__ import annotations

import json

import pytest
import torch

import gleanrl.cli
from gleanrl.trainer.bootstrap import bootstrap_policy


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    return bootstrap_policy(tmp_path_factory.mktemp("boot") / "policy", size="tiny", progress=False)


def test_tiny_bootstrap_is_a_loadable_model_directory(tiny_policy):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gleanrl.trainer.tasks.builtin import build_char_tokenizer

    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "bootstrap.json"):
        assert (tiny_policy / name).is_file(), name
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    model = AutoModelForCausalLM.from_pretrained(tiny_policy)
    assert model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    text = (
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "sum: a1 b2"}], add_generation_prompt=True, tokenize=False
        )
        + "a1=1 b2=3\n\\boxed{3}"
    )
    # the saved tokenizer must load as itself (not re-interpreted by the architecture's
    # default tokenizer)
    assert tokenizer(text).input_ids == build_char_tokenizer()(text).input_ids
    assert tokenizer.decode(tokenizer(text).input_ids) == text


def test_tiny_policy_has_learned_the_task_format(tiny_policy):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gleanrl.trainer.tasks import load_task
    from gleanrl.trainer.tasks.measure import sample_responses

    task = load_task(None)
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    model = AutoModelForCausalLM.from_pretrained(tiny_policy).eval()
    samples = task.prompts("test", 32, seed=0)
    nll = []
    with torch.no_grad():
        # per-token loss on reference solutions: uniform guessing would be ln(100) = 4.6
        for sample in samples:
            prompt = tokenizer(sample["prompt"], add_special_tokens=False).input_ids
            ids = (
                prompt + tokenizer(task.solution(sample), add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
            )
            labels = [-100] * len(prompt) + ids[len(prompt) :]
            nll.append(model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss.item())
    assert sum(nll) / len(nll) < 1.5
    responses = sample_responses(
        model, tokenizer, [s["prompt"] for s in samples], max_new_tokens=160, batch_size=32, progress=False
    )
    assert sum("\\boxed{" in text for text, _ in responses) >= len(samples) // 2


def test_second_call_is_cached_and_the_cache_dir_follows_gleanrl_cache(tiny_policy, tmp_path, monkeypatch):
    stamp = (tiny_policy / "model.safetensors").stat().st_mtime_ns
    assert bootstrap_policy(tiny_policy, size="tiny", progress=False) == tiny_policy
    assert (tiny_policy / "model.safetensors").stat().st_mtime_ns == stamp
    monkeypatch.setenv("GLEANRL_CACHE", str(tmp_path / "cache"))
    from gleanrl.trainer.bootstrap import cache_root

    assert cache_root() == tmp_path / "cache"


def test_same_seed_gives_the_same_weights_and_the_key_covers_every_argument(tiny_policy, tmp_path):
    from safetensors.torch import load_file

    from gleanrl.trainer.bootstrap import cache_key

    torch.set_num_threads(1)
    again = load_file(bootstrap_policy(tmp_path / "again", size="tiny", progress=False) / "model.safetensors")
    first = load_file(tiny_policy / "model.safetensors")
    assert all(torch.equal(first[k], again[k]) for k in first)
    key = json.loads((tiny_policy / "bootstrap.json").read_text())["key"]
    assert cache_key(None, 0, "tiny")[1] == key
    others = {cache_key(None, 1, "tiny")[1], cache_key("running_sums", 0, "tiny")[1], cache_key(None, 0, "small")[1]}
    assert key not in others and len(others) == 3


def test_refuses_to_overwrite_a_foreign_directory(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a bootstrap output"):
        bootstrap_policy(tmp_path, size="tiny", progress=False)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_cli_reports_user_errors_without_a_traceback(tmp_path, capsys):
    assert (
        gleanrl.cli.main(["bootstrap", "--size", "tiny", "--task", "no_such_task", "--out", str(tmp_path / "x")]) == 2
    )
    assert "unknown task" in capsys.readouterr().err


def test_task_without_solutions_is_refused(tmp_path, monkeypatch):
    (tmp_path / "nosol.py").write_text(
        "from gleanrl.trainer.tasks.base import Task\n\n\nclass T(Task):\n"
        "    def prompts(self, split, n, seed): return [{'prompt': 'x'}] * n\n"
        "    def reward(self, sample, response): return 0.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="solution"):
        bootstrap_policy(tmp_path / "out", task="nosol:T", size="tiny", progress=False)
    assert not (tmp_path / "out").exists()


def test_bootstrap_reports_held_out_reference_accuracy_and_measure_reproduces_it(tiny_policy, capsys):
    from gleanrl.trainer.tasks.measure import main as measure_main

    stats = json.loads((tiny_policy / "bootstrap.json").read_text())
    acc = stats["heldout_reference_accuracy"]
    assert acc["n"] == 192 and 0.0 <= acc["expected"] <= 1.0 and 0.0 <= acc["greedy"] <= 1.0
    assert stats["loss_curve"] and stats["loss_curve"][-1][1] == pytest.approx(stats["final_loss"], abs=0.5)
    assert measure_main([str(tiny_policy), "--reference", "--n", "192"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["expected"] == pytest.approx(acc["expected"], abs=2e-3) and again["n"] == 192
