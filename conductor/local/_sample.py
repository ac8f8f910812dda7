"""What sampling takes and gives: ``Sample``, one completion with its per-token log-probs; ``LogitsProcessorLike``,
what may reshape the scores it samples from; ``PromptCache``, how rows that share a prompt hold its cache.

They live below both ``LocalModel`` (``_model.py``), which hands requests to the generation code, and that code
(``_generate.py``), which builds the samples, so that neither of those two files imports the other's types.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias

if TYPE_CHECKING:
    import torch
    from transformers import LogitsProcessor

LogitsProcessorLike: TypeAlias = "LogitsProcessor | Callable[[torch.Tensor, torch.Tensor], torch.Tensor]"
"""A transformers ``LogitsProcessor`` or a function ``(input_ids, scores) -> scores``."""

PromptCache: TypeAlias = Literal["static", "dynamic"]
"""How the rows sampled from one prompt (``n > 1``) hold its cache. ``"static"`` (the default) preallocates room for
the new tokens and writes them in place; ``"dynamic"`` is transformers' default, a cache that grows by concatenation,
copying every layer's keys and values at each new token (slower: ``benchmarks/grpo_step.py`` measures by how much).
Both sample from the same distribution."""


@dataclass(frozen=True)
class Sample:
    """One sampled completion: its text, token ids, and each token's log-prob under the sampling policy.

    ``token_ids`` include the end-of-sequence token when the model produced one (a policy must learn to stop), and
    ``logprobs`` has one entry per token id. ``text`` is decoded without special tokens and cut at a stop string.

    In float32 ``logprobs`` equal ``sequence_logprobs`` to about 1e-5. In bfloat16 they differ by up to about 0.2
    (cached incremental decoding against one full pass), so a GRPO trainer on a bf16 base should take its old-policy
    log-probs from ``sequence_logprobs`` rather than from here. A model that samples in another dtype than it scores
    in (``ConductorLM``'s ``sampling_dtype``) records the sampling dtype's log-probs here.
    """

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_ids: tuple[int, ...]
    finish_reason: Literal["stop", "length"]

    @property
    def logprob(self) -> float:
        """The completion's total log-prob."""
        return float(sum(self.logprobs))
