"""Tiny Hugging Face models made locally, no network needed: a byte-level BPE tokenizer trained on a
built-in corpus and a random Qwen2 / Qwen3 / Llama causal LM, saved with `save_pretrained`."""

from __future__ import annotations

import argparse
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) , . ? !",
    "Speculative decoding drafts a few tokens and verifies them in one pass of the target model.",
    "Reinforcement learning from verifiable rewards samples many answers and reinforces the right ones.",
    "Question: what is 12 + 30? Answer: 42. Let us add step by step: 12, 42.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    'Hello, world! How are you today? I am fine, thank you. {"key": [1, 2, 3]}',
]


def build_tokenizer(corpus: list[str] | None = None, vocab_size: int = 384, chat_template: str = CHAT_TEMPLATE):
    """A byte-level BPE tokenizer (any text encodes, nothing is unknown) trained on `corpus`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=alphabet, show_progress=False
    )
    tok.train_from_iterator((corpus or _CORPUS) * 4, trainer=trainer)
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=chat_template, **special)


def make_tiny_model(
    out: str | Path,
    arch: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 1024,
    seed: int = 0,
    tokenizer=None,
    tie_word_embeddings: bool = False,
) -> Path:
    """Write a random tiny causal LM with its tokenizer to `out` and return the path."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    tokenizer = tokenizer or build_tokenizer()
    config_cls = {"qwen2": Qwen2Config, "qwen3": Qwen3Config, "llama": LlamaConfig}[arch]
    extra = {"head_dim": hidden_size // num_heads} if arch == "qwen3" else {}
    ids = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id, "bos_token_id": None}
    shape = dict(hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=num_heads)
    shape |= dict(num_key_value_heads=num_kv_heads, intermediate_size=intermediate_size)
    shape |= dict(max_position_embeddings=max_position_embeddings, tie_word_embeddings=tie_word_embeddings)
    config = config_cls(vocab_size=len(tokenizer), **shape, **ids, **extra)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if tie_word_embeddings:
        # explicit: transformers' init-time tying is a process-global switch threaded loads can leave off
        model.lm_head.weight = model.get_input_embeddings().weight
    with torch.no_grad():  # a larger init than the default gives peaked, varied greedy outputs
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.08 if "embed" in name or "lm_head" in name else 0.05)
    out = Path(out)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="directory to write the model to")
    parser.add_argument("--arch", choices=["qwen2", "qwen3", "llama"], default="qwen2", help="model family")
    parser.add_argument("--hidden-size", type=int, default=64, help="width")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")


def run(args: argparse.Namespace) -> int:
    path = make_tiny_model(args.out, args.arch, args.hidden_size, args.layers, seed=args.seed)
    print(f"wrote a tiny {args.arch} model to {path}")
    return 0
