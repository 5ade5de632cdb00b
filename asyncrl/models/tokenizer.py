"""The tiny model's tokenizer: one token per printable ASCII character, plus chat specials.

Built offline with the `tokenizers` library and wrapped as a transformers
`PreTrainedTokenizerFast`, so it saves, loads and applies its chat template like any hub
tokenizer. It does not aim at compression: a ~100-token vocabulary keeps the tiny model's
softmax cheap on CPU (see DESIGN.md).
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<unk>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer; `<|end|>` is both the turn end and EOS.

    Example: encode("1+2") -> 3 ids; the chat template wraps a user turn as
    "<|user|>What is 1+2?<|end|><|assistant|>".
    """
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", eos_token="<|end|>")
    tok.add_special_tokens({"additional_special_tokens": list(SPECIALS[3:])})
    tok.chat_template = CHAT_TEMPLATE
    return tok
