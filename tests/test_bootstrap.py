"""`gleanrl bootstrap` at the tiny size: a loadable, cached, deterministic Hugging Face model directory
whose policy already answers some running-sums problems."""
from __future__ import annotations

import json

import pytest
import torch

import gleanrl
from trainer.bootstrap import bootstrap_policy


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    return bootstrap_policy(tmp_path_factory.mktemp("boot") / "policy", size="tiny", progress=False)


def test_tiny_bootstrap_is_a_loadable_model_directory(tiny_policy):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.tasks.chartok import build_char_tokenizer

    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "bootstrap.json"):
        assert (tiny_policy / name).is_file(), name
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy)
    model = AutoModelForCausalLM.from_pretrained(tiny_policy)
    assert model.config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "sum: a1 b2"}], add_generation_prompt=True,
                                         tokenize=False) + "a1=1 b2=3\n\\boxed{3}"
    # the saved tokenizer must load as itself (not re-interpreted by the architecture's default tokenizer)
    assert tokenizer(text).input_ids == build_char_tokenizer()(text).input_ids
    assert tokenizer.decode(tokenizer(text).input_ids) == text


def test_tiny_policy_sometimes_answers_correctly(tiny_policy):
    from trainer.tasks.measure import measure_policy

    report = measure_policy(str(tiny_policy), n=96, max_new_tokens=128, batch_size=48, progress=False)
    assert report["accuracy"] > 0
    assert report["median"] > 1


def test_second_call_is_cached_and_the_cache_dir_follows_gleanrl_cache(tiny_policy, tmp_path, monkeypatch):
    stamp = (tiny_policy / "model.safetensors").stat().st_mtime_ns
    assert bootstrap_policy(tiny_policy, size="tiny", progress=False) == tiny_policy
    assert (tiny_policy / "model.safetensors").stat().st_mtime_ns == stamp
    monkeypatch.setenv("GLEANRL_CACHE", str(tmp_path / "cache"))
    from trainer.bootstrap import cache_root

    assert cache_root() == tmp_path / "cache"


def test_same_seed_gives_the_same_weights_and_another_seed_does_not(tiny_policy, tmp_path):
    from safetensors.torch import load_file

    torch.set_num_threads(1)
    again = load_file(bootstrap_policy(tmp_path / "again", size="tiny", progress=False) / "model.safetensors")
    first = load_file(tiny_policy / "model.safetensors")
    assert all(torch.equal(first[k], again[k]) for k in first)
    other = bootstrap_policy(tmp_path / "other", size="tiny", seed=1, progress=False)
    assert json.loads((other / "bootstrap.json").read_text())["key"] != json.loads(
        (tiny_policy / "bootstrap.json").read_text())["key"]


def test_refuses_to_overwrite_a_foreign_directory(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a bootstrap output"):
        bootstrap_policy(tmp_path, size="tiny", progress=False)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_cli_reports_user_errors_without_a_traceback(tmp_path, capsys):
    assert gleanrl.main(["bootstrap", "--size", "tiny", "--task", "no_such_task", "--out", str(tmp_path / "x")]) == 2
    assert "unknown task" in capsys.readouterr().err


def test_task_without_solutions_is_refused(tmp_path, monkeypatch):
    (tmp_path / "nosol.py").write_text(
        "class T:\n    def prompts(self, split, n, seed): return [{'prompt': 'x'}] * n\n"
        "    def reward(self, sample, response): return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="solution"):
        bootstrap_policy(tmp_path / "out", task="nosol:T", size="tiny", progress=False)
    assert not (tmp_path / "out").exists()
