"""A byte-level tokenizer with a ChatML chat template, built in memory, for the tiny test policy.

Every UTF-8 byte is one token (no merges), so any text round-trips and nothing needs a download.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

IM_START, IM_END, ENDOFTEXT, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, PAD)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2's template without its default system message."""


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A 260-token byte-level tokenizer: ids 0-3 are the special tokens, then the 256 bytes.

    ``<|im_end|>`` is the end-of-sequence token (as in SmolLM2); ``<|pad|>`` pads.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab |= {char: len(SPECIAL_TOKENS) + i for i, char in enumerate(alphabet)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=IM_START,
        eos_token=IM_END,
        unk_token=ENDOFTEXT,
        pad_token=PAD,
        padding_side="left",
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer
