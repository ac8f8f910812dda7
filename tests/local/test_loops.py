"""Rows that loop (the tiny local models repeat a sentence until the token cap) are stopped and cut after the first
copy of what they repeat, their tokens, log-probs and text kept aligned; text that repeats short items, as workflows
and lists of numbers do, is left as it is. On the tiny random policy (byte tokens: the most tokens a text can take),
and (slow) on SmolLM2 through the library's worker prompt."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from conductor.conductor_lm import ConductorLM  # noqa: E402
from conductor.local import local_worker  # noqa: E402
from conductor.local._generate import _StopOnLoop, generate_samples  # noqa: E402
from conductor.local._sample import Sample  # noqa: E402
from conductor.modules import WorkerPromptAdapter  # noqa: E402
from conductor.signatures import Solve  # noqa: E402

INTRO = "Colours:\n"  # ends unlike the loops below, so that a loop's first copy starts right after it
WORKFLOW = (
    'model_id = ["smollm2", "smollm2", "smollm2", "calculator", "smollm2"]\n'
    'subtasks = ["Answer True or False.", "Answer True or False.", "Vote.", "Compute 2*3.", "Give the answer."]\n'
    'access_list = [[], [0], [0, 1], [0, 1, 2], "all"]'
)
CAP = 400  # new tokens at most: more than any text below but the loops
NUMBERS = "Squares: " + str([i * i for i in range(40)])
ZEROS = "Counts: " + str([0] * 15) + ", then " + str([1] * 15)


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """One torch thread (see tests/conductor_lm/conftest.py)."""


@pytest.fixture(scope="module")
def tiny() -> ConductorLM:
    return ConductorLM.tiny(seed=0)


class Script:
    """Makes row ``i`` of one ``generate`` call write ``texts[i]`` and then end: the scripted token is raised just
    above the best one, so greedy decoding picks it while its log-prob still comes from the model (forcing it would
    make every log-prob 0). ``generated`` counts the tokens generated."""

    def __init__(self, policy: ConductorLM, texts: list[str]):
        end = min(policy.eos_ids)
        self.rows = [[*policy.tokenizer(text, add_special_tokens=False)["input_ids"], end] for text in texts]
        self.generated = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.clone()
        for row, ids in enumerate(self.rows):
            scores[row, ids[min(self.generated, len(ids) - 1)]] = scores[row].max() + 1.0
        self.generated += 1
        return scores


def _write(policy: ConductorLM, texts: list[str], n: int = 1, **options: Any) -> tuple[list[Sample], Script]:
    """Greedy samples of ``texts`` (one row each; with ``n > 1``, the ``n`` rows of one shared prompt), and the
    script that wrote them."""
    script = Script(policy, texts)
    questions = ["What are the colours?", "Name them."][: len(texts)] if n == 1 else ["What are the colours?"]
    rows = generate_samples(
        policy.sampling_model(),
        policy.tokenizer,
        [policy.encode(q) for q in questions],  # two lengths: left padding
        n,
        eos_ids=policy.eos_ids,
        pad_id=policy.pad_id,
        max_new_tokens=CAP,
        temperature=0,
        logits_processor=script,
        **options,
    )
    return [sample for row in rows for sample in row], script


def _assert_cut_from(cut: Sample, whole: Sample, policy: ConductorLM) -> None:
    """``cut`` is the start of ``whole``, its tokens, log-probs and text aligned."""
    kept = len(cut.token_ids)
    assert cut.token_ids == whole.token_ids[:kept] and len(cut.logprobs) == kept
    assert cut.logprobs == pytest.approx(whole.logprobs[:kept], abs=1e-6)
    assert cut.text == policy.decode(cut.token_ids)


@pytest.mark.parametrize(
    "block", ["Red, yellow ", "Red, blue and yellow. ", "The primary colours are red, blue, yellow. "]
)
def test_a_looping_row_stops_soon_after_its_third_copy_and_keeps_one(tiny: ConductorLM, block: str) -> None:
    (cut,), script = _write(tiny, [INTRO + block * 40], cut_loops=True)
    (whole,), _ = _write(tiny, [INTRO + block * 40], cut_loops=False)
    assert cut.text == INTRO + block and cut.finish_reason == "stop"
    assert whole.finish_reason == "length" and len(whole.token_ids) == CAP
    _assert_cut_from(cut, whole, tiny)
    third_copy_end = len(INTRO) + 3 * len(block)  # bytes are tokens here
    assert script.generated <= third_copy_end + 2 * len(block)


@pytest.mark.parametrize("text", [WORKFLOW, NUMBERS, ZEROS], ids=["workflow", "numbers", "zeros"])
def test_text_that_repeats_short_items_is_left_whole(tiny: ConductorLM, text: str) -> None:
    (sample,), script = _write(tiny, [text], cut_loops=True)
    assert sample.text == text and sample.finish_reason == "stop"  # it ended at end-of-sequence
    assert len(sample.token_ids) == script.generated == len(text.encode()) + 1


@pytest.mark.parametrize("n", [1, 2], ids=["two prompts", "one prompt twice"])
def test_in_a_batch_only_the_looping_row_is_cut(tiny: ConductorLM, n: int) -> None:
    block = "Red, blue and yellow. "
    texts = [WORKFLOW, INTRO + block * 40]
    (workflow, looped), _ = _write(tiny, texts, n, cut_loops=True)
    (_, whole), _ = _write(tiny, texts, n, cut_loops=False)
    assert workflow.text == WORKFLOW and workflow.finish_reason == "stop"
    assert looped.text == INTRO + block and looped.finish_reason == "stop"
    _assert_cut_from(looped, whole, tiny)


def test_by_default_a_loop_is_cut_unless_a_logits_processor_shapes_the_text(tiny: ConductorLM) -> None:
    prompt = [tiny.encode("x")]
    options = {"eos_ids": tiny.eos_ids, "pad_id": tiny.pad_id, "max_new_tokens": 200, "temperature": 0}
    # greedy, the random policy writes one byte over and over
    ((cut,),) = generate_samples(tiny.sampling_model(), tiny.tokenizer, prompt, 1, **options)
    ((whole,),) = generate_samples(tiny.sampling_model(), tiny.tokenizer, prompt, 1, **options, cut_loops=False)
    assert len(set(whole.token_ids)) == 1 and whole.finish_reason == "length"
    assert len(cut.token_ids) == 8 and cut.finish_reason == "stop"  # one copy of the shortest block counted
    _assert_cut_from(cut, whole, tiny)
    (shaped,), _ = _write(tiny, [INTRO + "Red, blue and yellow. " * 40])  # a grammar bounds what it lets through
    assert shaped.finish_reason == "length" and len(shaped.token_ids) == CAP


def _first_loop(tokens: list[int]) -> tuple[int, int | None] | None:
    """(tokens generated, tokens kept) when ``_StopOnLoop`` first stops a row that writes ``tokens``, or None."""
    prompt = [0, 0]
    loops = _StopOnLoop(1, len(prompt), "cpu")
    for generated in range(1, len(tokens) + 1):
        if loops(torch.tensor([prompt + tokens[:generated]]), torch.zeros(1, 1)).item():
            return generated, loops.loop_ends()[0]
    return None


def _identical_items(count: int, size: int) -> list[int]:
    """A list of ``count`` identical items of ``size`` tokens each, separator included, then another item:
    ``[a b c, a b c, a b c, d]``."""
    item = [*range(10, 9 + size), 2]
    return [1, *(item * count), 3, 4, 5]


@pytest.mark.parametrize(
    ("count", "size", "kept"),
    [(2, 200, None), (3, 23, None), (3, 24, 25), (5, 11, None), (5, 12, 13), (15, 3, None), (16, 3, 10)],
)
def test_identical_list_items_count_as_a_loop_only_past_the_documented_sizes(
    count: int, size: int, kept: int | None
) -> None:
    """The thresholds' comment in ``_generate.py``: two identical items in a row are never a loop, three only of 24+
    tokens each, five only of 12+, short ones only over 48 tokens. What is kept is the opening token and one item or,
    for short items, one block of 8 tokens or more."""
    found = _first_loop(_identical_items(count, size))
    assert (found and found[1]) == kept


# --- SmolLM2 through the worker prompt (slow) ---------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_stops_its_primary_colours_loop_well_before_the_cap() -> None:
    """Greedy, SmolLM2 answers "Name three primary colors." through the worker prompt (the subtask "all", as the
    shipped router wrote it) with a paragraph whose sentence repeats until the 256-token cap; cut, it keeps one copy."""
    worker = local_worker("smollm2-135m-instruct", max_tokens=256, temperature=0.0)
    inputs = {"question": "Name three primary colors.", "subtask": "all"}
    messages = WorkerPromptAdapter().format(Solve, [], inputs)
    completion = worker.complete(messages, max_tokens=256, temperature=0)
    model = worker.lm.engine.model
    prompt = model.encode(messages)
    assert len(prompt) == completion.input_tokens
    ((whole,),) = generate_samples(
        model.model,
        model.tokenizer,
        [prompt],
        1,
        eos_ids=model.eos_ids,
        pad_id=model.pad_id,
        max_new_tokens=256,
        temperature=0,
        cut_loops=False,
    )
    assert len(whole.token_ids) == 256 and whole.finish_reason == "length"  # the prompt still loops
    assert completion.output_tokens <= 128
    sentence = "This example is a classic example of a multi-step process"
    assert completion.text.count(sentence) == 1 and whole.text.count(sentence) >= 4
    assert whole.text.startswith(completion.text)
