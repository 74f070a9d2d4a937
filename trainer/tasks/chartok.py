"""A character-level tokenizer for the built-in tasks: one token per printable ASCII character (plus newline) and
ChatML's special tokens, saved as a standard `tokenizer.json` that transformers, SGLang and the embedded server
load. A small vocabulary keeps the policy's embedding and lm_head cheap.
"""

from __future__ import annotations

import string

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|unk|>"]
CHARS = "\n" + "".join(c for c in string.printable if c.isprintable())  # space .. ~, 95 characters


def chatml(user: str) -> str:
    """The exact text CHAT_TEMPLATE renders for one user turn with the generation prompt."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def build_char_tokenizer():
    """PreTrainedTokenizerFast: specials first (ids 0..3), then one id per character; eos = <|im_end|>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"(?m)."), behavior="isolated")  # every char alone
    tok.decoder = decoders.Fuse()  # join pieces without spaces
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|unk|>",
        bos_token=None,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
