"""``LocalModel``: a causal LM and its tokenizer, with the one way this package encodes prompts and generates."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from conductor.errors import ConfigError
from conductor.local._encoding import PLAIN_STOP, Prompt, encode_prompt, has_chat_template
from conductor.local._sample import LogitsProcessorLike, PromptCache, Sample

if TYPE_CHECKING:
    import torch


def _as_lists(ids: Any) -> Any:
    """Tensors and arrays of token ids as (nested) lists of ints; lists and tuples as they are."""
    return ids.tolist() if hasattr(ids, "tolist") else ids


class LocalModel:
    """A causal LM (transformers, or a peft model around one) and its tokenizer.

    A frozen model comes from the load-once cache (``frozen_model``) and is shared by every local worker over it; a
    trainable policy (``ConductorLM``) is a subclass with its own copy of the weights and ``trainable = True``.
    ``sample`` is thread-safe: calls on one model run one at a time (torch runs one generation at a time well on
    few cores).
    """

    trainable = False
    """Whether this model has weights of its own that training changes (``trainable_policy`` finds those)."""

    def __init__(self, model: Any, tokenizer: Any, *, name: str):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids: set[int] = set(eos) if isinstance(eos, list) else {eos} - {None}
        if not self.eos_ids:
            raise ConfigError(f"{name} has no end-of-sequence token: set generation_config.eos_token_id")
        self.lock = threading.Lock()

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)

    @property
    def context_window(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    def encode(self, prompt: Prompt) -> list[int]:
        """Prompt token ids: raw text as is, chat messages through the one chat encoding, token ids unchanged."""
        return encode_prompt(self.tokenizer, prompt)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def sample(
        self,
        prompts: Sequence[Prompt],
        n: int = 1,
        *,
        max_new_tokens: int = 256,
        temperature: float | None = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        logits_processor: LogitsProcessorLike | Sequence[LogitsProcessorLike] | None = None,
        stop: Sequence[str] = (),
        batch_size: int | None = None,
        prompt_cache: PromptCache = "static",
    ) -> list[list[Sample]]:
        """``n`` samples per prompt (``result[i][j]``), with per-token log-probs under the sampling policy.

        ``temperature`` 0 or ``None`` is greedy; ``top_k`` 0 keeps every token. Runs in eval mode without gradient,
        seeded with ``seed`` without touching the global RNG state. A model without a chat template also stops at
        ``PLAIN_STOP`` (see ``conductor.local._encoding``). ``prompt_cache``: see ``PromptCache``.
        """
        from conductor.local._generate import generate_samples

        ids = [self.encode(p) for p in prompts]
        if not has_chat_template(self.tokenizer):
            stop = (*stop, PLAIN_STOP)
        with self.lock:
            return generate_samples(
                self.sampling_model(),
                self.tokenizer,
                ids,
                n,
                eos_ids=self.eos_ids,
                pad_id=self.pad_id,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                seed=seed,
                logits_processor=logits_processor,
                stop=stop,
                batch_size=batch_size,
                prompt_cache=prompt_cache,
            )

    def sampling_model(self) -> Any:
        """The model ``sample`` generates with: this model itself (a subclass may sample from a copy of it)."""
        return self.model

    def sequence_logprobs(
        self,
        prompt_ids: Sequence[int] | Sequence[Sequence[int]],
        completion_ids: Sequence[int] | Sequence[Sequence[int]],
        *,
        grad: bool = False,
        temperature: float = 1.0,
        batch_size: int | None = None,
        common_prefix: bool = True,
    ) -> torch.Tensor | list[torch.Tensor]:
        """Per-token log-probs of completions under the current weights: one 1-D tensor for one
        ``(prompt, completion)`` pair of id lists, a list of them for lists of pairs. With ``grad``, the tensors
        carry a graph back to the trainable weights (GRPO's new-policy term). Different prompts share one pass over
        their common prefix where that is cheaper; ``common_prefix=False`` gives each distinct prompt a pass of its
        own (``benchmarks/shared_prefix.py`` compares the two)."""
        from conductor.local._generate import sequence_logprobs

        prompt_ids, completion_ids = _as_lists(prompt_ids), _as_lists(completion_ids)
        single = len(prompt_ids) > 0 and isinstance(prompt_ids[0], int)
        prompts = [prompt_ids] if single else [_as_lists(p) for p in prompt_ids]
        completions = [completion_ids] if single else [_as_lists(c) for c in completion_ids]
        out = sequence_logprobs(
            self.model,
            prompts,
            completions,
            pad_id=self.pad_id,
            temperature=temperature,
            grad=grad,
            batch_size=batch_size,
            common_prefix=common_prefix,
        )
        return out[0] if single else out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
