"""The one place that calls a model's ``generate``: batched sampling with the log-probs of the sampling policy, and
teacher-forced log-probs for GRPO. ``LocalModel`` is the way in; this module needs torch and transformers.

The log-probs of a sampled token are read from the very scores ``generate`` samples from (after any custom logits
processor, temperature and top-p), by a recorder that runs last in the processor list. It keeps only one step's
distribution, so memory stays at ``batch x vocab`` instead of ``steps x batch x vocab`` (``output_scores=True`` would
hold about 50 GB for 256 rollouts of 1,024 tokens over SmolLM2's 49K vocabulary).

A row that loops (writes a phrase a third time, as the tiny local models do) is stopped there and cut after the first
copy (``_StopOnLoop``), so that a worker returns one copy and spends no time on the rest.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, get_args

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from conductor.errors import ConductorError
from conductor.local._sample import LogitsProcessorLike, PromptCache, Sample

logger = logging.getLogger(__name__)


class _LogprobRecorder(LogitsProcessor):
    """Records the log-prob of each sampled token under the final (processed) scores; must run last.

    At step t it sees the token sampled at step t-1 as the last input id, and looks it up in the distribution it kept
    from step t-1. ``finish`` handles the last token, which no later step sees.
    """

    def __init__(self) -> None:
        self.previous: torch.Tensor | None = None
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.previous is not None:
            self.logprobs.append(self.previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """``(batch, new)`` log-probs of ``new_tokens``, the tokens ``generate`` appended."""
        if new_tokens.shape[1] > len(self.logprobs) and self.previous is not None:
            self.logprobs.append(self.previous.gather(1, new_tokens[:, -1:]).squeeze(1))
        self.previous = None
        if not self.logprobs:
            return new_tokens.new_zeros(new_tokens.shape, dtype=torch.float32)
        return torch.stack(self.logprobs[: new_tokens.shape[1]], dim=1)


class _CallableProcessor(LogitsProcessor):
    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        self.fn = fn

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return self.fn(input_ids, scores)


def _processors(logits_processor: LogitsProcessorLike | Sequence[LogitsProcessorLike] | None) -> list[LogitsProcessor]:
    if logits_processor is None:
        return []
    items = [logits_processor] if callable(logits_processor) else list(logits_processor)
    return [p if isinstance(p, LogitsProcessor) else _CallableProcessor(p) for p in items]


class _StopOnText(StoppingCriteria):
    """Ends each row once its new text contains a stop string.

    Decodes only the last few tokens of each row (enough for the longest stop string even at 4 bytes a character),
    which costs little next to a forward pass; transformers' own ``stop_strings`` first tabulates the whole
    vocabulary (seconds for Gemma's 262K tokens).
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str], prompt_width: int):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.prompt_width = prompt_width
        self.window = 4 * max(len(s) for s in stop) + 8

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        tails = input_ids[:, self.prompt_width :][:, -self.window :].tolist()
        texts = self.tokenizer.batch_decode(tails, skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stop) for t in texts], device=input_ids.device)


# A row loops when its last PHRASE_TOKENS new tokens were written twice before (so three times in all), each earlier
# copy at least MIN_LOOP_GAP and at most LOOP_WINDOW tokens back, the earliest LOOP_TOKENS or more back. It is cut
# after its first copy: after one block when the copies run back to back, else where the second copy begins.
# Why these numbers:
# - Loops that SmolLM2 writes through the worker prompt: a 21-token line back to back (stopped after 66 of 256
#   tokens), and a 28-token sentence twice per paragraph, paragraph after paragraph (stopped after 163). Asking for
#   three copies back to back would have let the second run to the cap; two would cut two identical subtasks.
# - Verbatim repeats in a workflow are identical list items in a row: two are never cut (one earlier copy), three
#   only as items of 24+ tokens each (separator included), four or five (the default max_steps) only as 12+ tokens
#   each (a worker's name with its separator, `"smollm2", `, is about 6). A conductor under the workflow grammar is
#   never cut (see ``generate_samples``).
# - Copies closer than 8 tokens don't count, and nothing under 48 new tokens is ever cut: list punctuation and runs of
#   short items (`[[], [0], [0, 1]]`, `0, 0, 0`, `| --- |`) count only after 48 tokens of them (16 items of 3 tokens).
# - The work per token is small: the newest token is compared with the 256 before it, and nothing is decoded.
PHRASE_TOKENS = 24
MIN_LOOP_GAP = 8
LOOP_WINDOW = 256
LOOP_TOKENS = 48


class _StopOnLoop(StoppingCriteria):
    """Ends each row once it loops (see the thresholds above), and remembers how many of its new tokens to keep
    (``loop_ends``).

    ``runs[row, i]`` counts the new tokens in a row, up to the newest, that equal the token ``lags[i]`` before them:
    the last ``run`` tokens were written ``lags[i]`` tokens earlier too. A run of ``PHRASE_TOKENS`` or more is an
    earlier copy of the last phrase; a run of ``lags[i]`` or more means that the last ``lags[i] + run`` tokens repeat
    one block of ``lags[i]`` tokens back to back. Each call updates the runs by the newest token, so ``generate``
    must call it once per new token (as it does).
    """

    def __init__(self, rows: int, prompt_width: int, device: Any):
        self.prompt_width = prompt_width
        self.lags = torch.arange(MIN_LOOP_GAP, LOOP_WINDOW + 1, device=device)
        self.runs = torch.zeros((rows, len(self.lags)), dtype=torch.long, device=device)
        self.kept = torch.full((rows,), -1, dtype=torch.long, device=device)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        width = input_ids.shape[1]
        generated = width - self.prompt_width
        earlier = input_ids[:, (width - 1 - self.lags).clamp(min=0)]
        same = (earlier == input_ids[:, -1:]) & (self.lags < generated)  # never compare with the prompt
        self.runs = (self.runs + 1) * same
        copied = self.runs >= PHRASE_TOKENS  # where the last phrase was written before
        earliest = torch.where(copied, self.lags, 0).amax(dim=1)
        latest = torch.where(copied, self.lags, LOOP_WINDOW).amin(dim=1)
        looping = (copied.sum(dim=1) >= 2) & (earliest + PHRASE_TOKENS >= LOOP_TOKENS)
        run_at_latest = self.runs.gather(1, (latest - MIN_LOOP_GAP).unsqueeze(1)).squeeze(1)
        back_to_back = run_at_latest >= latest
        # back to back: keep one block; else: keep up to where the second copy begins, but at least the first copy
        second_copy = torch.minimum(latest + run_at_latest, earliest)
        keep = generated - torch.where(back_to_back, run_at_latest, second_copy)
        self.kept = torch.where(looping & (self.kept < 0), keep, self.kept)
        return looping

    def loop_ends(self) -> list[int | None]:
        """For each row, how many of its new tokens to keep (up to the end of the first copy), or ``None`` where the
        row never looped."""
        return [None if kept < 0 else kept for kept in self.kept.tolist()]


def _left_pad(rows: Sequence[Sequence[int]], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
    return ids.to(device), mask.to(device)


def _stop_end(tokenizer: Any, tokens: list[int], stop: Sequence[str]) -> int | None:
    """The fewest leading tokens whose text contains a stop string, or ``None``."""

    def hit(k: int) -> bool:
        text = tokenizer.decode(tokens[:k], skip_special_tokens=True)
        return any(s in text for s in stop)

    if not stop or not tokens or not hit(len(tokens)):
        return None
    low, high = 1, len(tokens)
    while low < high:
        mid = (low + high) // 2
        if hit(mid):
            high = mid
        else:
            low = mid + 1
    return low


def _cut(text: str, stop: Sequence[str]) -> str:
    cut = min((text.index(s) for s in stop if s in text), default=None)
    return text if cut is None else text[:cut]


def generate_samples(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    n: int,
    *,
    eos_ids: set[int],
    pad_id: int,
    max_new_tokens: int,
    temperature: float | None,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    logits_processor: LogitsProcessorLike | Sequence[LogitsProcessorLike] | None = None,
    stop: Sequence[str] = (),
    batch_size: int | None = None,
    prompt_cache: PromptCache = "static",
    cut_loops: bool | None = None,
) -> list[list[Sample]]:
    """``n`` samples for each tokenised prompt; ``temperature`` 0 or ``None`` decodes greedily, ``top_k`` 0 keeps
    every token.

    With ``n > 1`` each prompt's ``n`` rows share one pass over the prompt (its cache computed once and repeated,
    as ``sequence_logprobs`` does), in batches of at most ``batch_size`` rows; with ``n == 1`` the prompts run in
    left-padded batches of ``batch_size`` (all at once when ``None``). The same seed, prompts and ``batch_size``
    give the same samples. Greedy log-probs are those of the temperature-1 distribution (after any custom processor).
    ``prompt_cache`` says how the shared rows hold the prompt's cache (see ``PromptCache``).

    ``cut_loops``: stop a row that loops and keep one copy of what it repeats (``_StopOnLoop``; its ``finish_reason``
    is then "stop"). ``None`` (the default) cuts unless a ``logits_processor`` shapes the text: the workflow grammar
    bounds every string itself, and a cut would leave a text that it does not accept.
    """
    _check_request(prompts, n, max_new_tokens, top_p, top_k, prompt_cache)
    cut_loops = logits_processor is None if cut_loops is None else cut_loops
    greedy = temperature is None or temperature <= 0
    batches = _batches(prompts, n, batch_size)
    device = next(model.parameters()).device
    options = _generate_options(max_new_tokens, eos_ids, pad_id, greedy)
    samples: list[Sample] = []
    devices = [device] if device.type == "cuda" else []
    seeded = torch.random.fork_rng(devices=devices, enabled=seed is not None)
    with _eval_mode(model), seeded, torch.no_grad():
        if seed is not None:
            torch.manual_seed(seed)
        for chunk, shared in batches:
            recorder = _LogprobRecorder()
            processors = _sampling_processors(logits_processor, recorder, temperature, top_k, top_p, greedy)
            input_ids, attention_mask = _left_pad(chunk, pad_id, device)
            stopping, loops = _stopping_criteria(tokenizer, stop, cut_loops, input_ids)
            # the cache of all but the last prompt token: generate runs that token and the new ones
            prefix = _shared_prompt_cache(model, chunk, max_new_tokens, prompt_cache) if shared else {}
            new = _new_tokens(model, input_ids, attention_mask, processors, stopping, options | prefix)
            logprobs = recorder.finish(new).cpu()
            loop_ends = loops.loop_ends() if loops is not None else [None] * len(chunk)
            for prompt, tokens, row_logprobs, loop_end in zip(chunk, new.tolist(), logprobs, loop_ends, strict=True):
                samples.append(_sample(tokenizer, prompt, tokens, row_logprobs, eos_ids, stop, loop_end))
    return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]


def _stopping_criteria(
    tokenizer: Any, stop: Sequence[str], cut_loops: bool, input_ids: torch.Tensor
) -> tuple[StoppingCriteriaList, _StopOnLoop | None]:
    """The criteria that end rows of one ``generate`` call over ``input_ids`` early, and the loop one among them (it
    knows where each looping row is to be cut)."""
    rows, width = input_ids.shape
    loops = _StopOnLoop(rows, width, input_ids.device) if cut_loops else None
    criteria = [_StopOnText(tokenizer, stop, width)] if stop else []
    return StoppingCriteriaList(criteria + ([loops] if loops is not None else [])), loops


def _new_tokens(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, processors: Any, stopping: Any, options: dict
) -> torch.Tensor:
    """Each row's generated tokens (the prompt's cut off)."""
    output = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        logits_processor=processors,
        stopping_criteria=stopping,
        **options,
    )
    return output[:, input_ids.shape[1] :]


@contextlib.contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    """``model`` in eval mode (no dropout) for the block, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _check_request(
    prompts: Sequence[Sequence[int]], n: int, max_new_tokens: int, top_p: float, top_k: int, prompt_cache: str
) -> None:
    """Refuse a sampling request that can't be met, before any model work."""
    if n < 1 or max_new_tokens < 1:
        raise ValueError(f"n and max_new_tokens must be at least 1, got n={n}, max_new_tokens={max_new_tokens}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be 0 (off) or positive, got {top_k}")
    if prompt_cache not in get_args(PromptCache):
        raise ValueError(f"prompt_cache must be one of {get_args(PromptCache)}, got {prompt_cache!r}")
    if any(len(p) == 0 for p in prompts):
        raise ConductorError("a prompt has no tokens")


def _batches(prompts: Sequence[Sequence[int]], n: int, batch_size: int | None) -> list[tuple[list[list[int]], bool]]:
    """The rows of each ``generate`` call, and whether they are copies of one prompt (``n > 1``: they share its
    cache) or different prompts (``n == 1``: left-padded)."""
    step = batch_size or len(prompts) * n
    if n == 1:
        return [([list(p) for p in prompts[i : i + step]], False) for i in range(0, len(prompts), step)]
    return [([list(p)] * min(step, n - i), True) for p in prompts for i in range(0, n, step)]


def _generate_options(max_new_tokens: int, eos_ids: set[int], pad_id: int, greedy: bool) -> dict[str, Any]:
    """``generate``'s keyword arguments: the length, the end and padding tokens, and a distribution that only our
    own processors shape."""
    options: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "eos_token_id": sorted(eos_ids),
        "pad_token_id": pad_id,
        "do_sample": not greedy,
        # neutralise anything a model's generation_config sets that would change the distribution
        "repetition_penalty": 1.0,
        "no_repeat_ngram_size": 0,
    }
    if not greedy:  # temperature, top-k and top-p are applied by our own warpers, before the recorder
        options |= {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "typical_p": 1.0, "min_p": None}
    return options


def _sampling_processors(
    logits_processor: LogitsProcessorLike | Sequence[LogitsProcessorLike] | None,
    recorder: _LogprobRecorder,
    temperature: float | None,
    top_k: int,
    top_p: float,
    greedy: bool,
) -> LogitsProcessorList:
    """The custom processors, then temperature, top-k and top-p when sampling, then ``recorder`` last (it reads the
    distribution the token is drawn from)."""
    processors = LogitsProcessorList(_processors(logits_processor))
    if not greedy and temperature != 1.0:
        processors.append(TemperatureLogitsWarper(float(temperature)))
    if not greedy and top_k > 0:
        processors.append(TopKLogitsWarper(top_k))
    if not greedy and top_p < 1.0:
        processors.append(TopPLogitsWarper(top_p))
    processors.append(recorder)
    return processors


def _shared_prompt_cache(
    model: Any, chunk: list[list[int]], max_new_tokens: int, prompt_cache: PromptCache
) -> dict[str, Any]:
    """The cache of the one prompt that the rows of ``chunk`` repeat, held as ``prompt_cache`` says, as
    ``generate``'s keyword argument."""
    prompt = chunk[0]
    if prompt_cache == "static":
        return _prefill_to_generate(model, prompt, len(chunk), max_new_tokens)
    return _prefill(model, prompt[:-1], len(chunk))[1] if len(prompt) > 1 else {}


def _prefill(model: Any, prompt: Sequence[int], rows: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """One pass over ``prompt``: the logits of its last position, and its cache repeated for ``rows`` rows as the
    forward's (and ``generate``'s) keyword argument, so that each row continues from the prompt without redoing it."""
    device = next(model.parameters()).device
    head = model(input_ids=torch.tensor([list(prompt)], device=device), use_cache=True, **_one_logit(model))
    name = _cache_name(head)
    cache = head[name]
    if rows > 1:
        cache.batch_repeat_interleave(rows)
    return head.logits[:, -1:], {name: cache}


def _prefill_to_generate(model: Any, prompt: Sequence[int], rows: int, max_new_tokens: int) -> dict[str, Any]:
    """The cache of all but the last token of ``prompt``, computed once and written into a preallocated (static)
    cache of ``rows`` rows with room for ``max_new_tokens`` more, as ``generate``'s keyword argument.

    Why static: a dynamic cache grows by concatenation, which copies every layer's keys and values into a fresh
    allocation at each new token; sampling SmolLM2 16 rows at a time on CPU, those copies were a quarter of the time
    (profiled: 25%, the matrix products 41%). A static cache is written in place. It attends over its full length
    every step (masked), which is cheap at these lengths."""
    if len(prompt) < 2:
        return {}
    from transformers import StaticCache

    _, dynamic = _prefill(model, prompt[:-1], 1)
    name, filled = next(iter(dynamic.items()))
    cache = StaticCache(config=model.config, max_cache_len=len(prompt) + max_new_tokens)
    for index, layer in enumerate(filled.layers):
        cache.update(layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1), index)
    return {name: cache}


def _cache_name(output: Any) -> str:
    """Where a model output keeps its cache, which is also the forward's keyword for it (transformers 5 renamed
    ``past_key_values`` to ``cache``)."""
    return "cache" if "cache" in output else "past_key_values"


def _one_logit(model: Any) -> dict[str, int]:
    """Keep only the last position's logits, where the model allows it (a pass over a prompt needs no others)."""
    return {"logits_to_keep": 1} if _accepts_logits_to_keep(model) else {}


def _sample(
    tokenizer: Any,
    prompt: list[int],
    tokens: list[int],
    logprobs: torch.Tensor,
    eos_ids: set[int],
    stop: Sequence[str],
    loop_end: int | None,
) -> Sample:
    """Cut one generated row where it really ended (the rest is padding), at a stop string, or after the first copy
    of what it repeats (``loop_end`` tokens), whichever comes first, and decode it."""
    eos_end = next((i + 1 for i, t in enumerate(tokens) if t in eos_ids), None)
    body = tokens[: eos_end - 1] if eos_end else tokens
    end = min((e for e in (eos_end, _stop_end(tokenizer, body, stop), loop_end) if e is not None), default=None)
    finish: Literal["stop", "length"] = "stop" if end is not None else "length"
    end = end if end is not None else len(tokens)
    kept = tokens[:end]
    text = tokenizer.decode([t for t in kept if t not in eos_ids], skip_special_tokens=True)
    return Sample(
        text=_cut(text, stop),
        token_ids=tuple(kept),
        logprobs=tuple(logprobs[:end].tolist()),
        prompt_ids=tuple(prompt),
        finish_reason=finish,
    )


def _accepts_logits_to_keep(model: Any) -> bool:
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def sequence_logprobs(
    model: Any,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    *,
    pad_id: int,
    temperature: float = 1.0,
    grad: bool = False,
    batch_size: int | None = None,
    common_prefix: bool = True,
) -> list[torch.Tensor]:
    """Per-token log-probs of each completion after its prompt under the current weights (teacher forcing).

    Completions that share a prompt (a GRPO group) share one pass over it: the prompt's keys and values are computed
    once and repeated for each completion, so the cost is one prompt plus the completions rather than a prompt per
    completion (with a 330-token prompt and 30-token workflows, about a fifth of the tokens). A completion that
    recurs after the same prompt (a group that agrees on a workflow) is scored once and its tensor shared, so its
    gradient counts once per occurrence, as before; with LoRA dropout on, the occurrences share one dropout draw.
    ``batch_size`` bounds the distinct completions in one pass. The model's train/eval mode is left as it is (LoRA
    dropout applies in train mode). Returns one float32 tensor per completion, on the model's device, with a graph
    when ``grad``. ``common_prefix=False`` never shares a pass between different prompts (only between the
    completions of one prompt): the plan before prompts shared their common prefix, kept to measure what that saves.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if any(len(p) == 0 for p in prompts):
        raise ConductorError("a prompt has no tokens")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    keys = [(tuple(p), tuple(c)) for p, c in zip(prompts, completions, strict=True)]
    first: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}  # each distinct pair is scored once
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    step = batch_size or max(len(prompts), 1)
    out: list[torch.Tensor | None] = [None] * len(prompts)
    device = next(model.parameters()).device
    with torch.enable_grad() if grad else torch.no_grad():
        scored = [i for i in first.values() if completions[i]]
        for prefix, rows in _passes(prompts, completions, scored, common_prefix):
            for start in range(0, len(rows), step):
                chunk = rows[start : start + step]
                skipped = min(skip for _, _, skip in chunk)
                rows_tokens = [tokens for _, tokens, _ in chunk]
                scores = _shared_prefix_logprobs(model, prefix, rows_tokens, pad_id, temperature, skipped)
                for (i, _, skip), row in zip(chunk, scores, strict=True):
                    out[i] = row[skip - skipped :]
        for i, key in enumerate(keys):
            out[i] = out[first[key]] if completions[i] else torch.zeros(0, device=device)
    return out  # type: ignore[return-value]


Pass = tuple[Sequence[int], list[tuple[int, list[int], int]]]
"""A prefix computed once, and the rows that continue it: (pair index, tokens after the prefix, how many of those
are the rest of the prompt, whose log-probs are not returned)."""


def _passes(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    indices: list[int],
    common_prefix: bool = True,
) -> list[Pass]:
    """How to score the pairs at ``indices`` with the fewest tokens: a pass per distinct prompt (a GRPO group shares
    its prompt), or, with ``common_prefix``, one pass after the prompts' common prefix when that is cheaper (a
    warm-start batch of different questions whose prompts differ only near the end)."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i in indices:
        by_prompt.setdefault(tuple(prompts[i]), []).append(i)
    per_prompt: list[Pass] = [(p, [(i, list(completions[i]), 0) for i in members]) for p, members in by_prompt.items()]
    if len(by_prompt) < 2 or not common_prefix:
        return per_prompt
    columns = enumerate(zip(*by_prompt, strict=False))  # token by token, up to the shortest prompt
    common = next((k for k, tokens in columns if len(set(tokens)) > 1), min(map(len, by_prompt)))
    if common == 0:
        return per_prompt
    # the completions cost the same either way: compare the prompt tokens each plan runs
    if common + sum(len(prompts[i]) - common for i in indices) >= sum(map(len, by_prompt)):
        return per_prompt
    rows = [(i, [*prompts[i][common:], *completions[i]], len(prompts[i]) - common) for i in indices]
    return [(prompts[indices[0]][:common], rows)]


def _shared_prefix_logprobs(
    model: Any,
    prompt: Sequence[int],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    temperature: float,
    skip: int = 0,
) -> list[torch.Tensor]:
    """The log-probs of each of ``completions`` after the one ``prompt`` (a prompt, or a prefix that the rows
    continue), from each row's token ``skip`` on: a pass over the prompt with its cache kept, the cache repeated once
    per completion, then one pass over the (right-padded) completions.

    Rows that continue a prefix begin with the rest of their prompt, whose log-probs are never used: ``skip`` (the
    fewest such tokens in any row) leaves those positions out of the output layer, which is a fifth of SmolLM2's
    weights and, with its 49,152-word softmax, about a tenth of a warm-start step's time."""
    device = next(model.parameters()).device
    last, cached = _prefill(model, prompt, len(completions))
    logits = last.expand(len(completions), -1, -1)  # the prompt's last position predicts token 0
    longest = max(len(c) for c in completions)
    targets = torch.full((len(completions), longest), pad_id, dtype=torch.long)
    for i, completion in enumerate(completions):
        targets[i, : len(completion)] = torch.tensor(list(completion), dtype=torch.long)
    targets = targets.to(device)
    if longest > 1:  # tokens 0..n-2 predict tokens 1..n-1; right padding is never attended to by a real token
        inputs = targets[:, :-1]
        positions = torch.arange(len(prompt), len(prompt) + longest - 1, device=device).expand(len(completions), -1)
        mask = torch.ones((len(completions), len(prompt) + longest - 1), dtype=torch.long, device=device)
        keep = longest - skip  # positions skip-1 onwards predict tokens skip onwards
        kept = {"logits_to_keep": keep} if skip and _accepts_logits_to_keep(model) else {}
        tail = model(input_ids=inputs, attention_mask=mask, position_ids=positions, **cached, **kept).logits
        logits = tail[:, -keep:] if skip else torch.cat([logits, tail], dim=1)
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = targets[:, skip:]
    token_logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
    return [token_logprobs[i, : len(c) - skip] for i, c in enumerate(completions)]
