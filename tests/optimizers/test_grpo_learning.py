"""GRPO teaches the real SmolLM2 conductor which worker answers which kind of task (slow: loads the embedded model).

The pool holds K=2 scripted workers and the data K task families ("Spell ... backwards", "Add ... and ..."); each
family is answered right by one worker only, a different one per family. Workflows have one step and a one-byte
subtask under the workflow grammar, so a completion is about 25 tokens and the only real choice in it is the worker
id.

The probability that the conductor picks the right worker is measured by sampling (32 samples per family at
temperature 1, under the same grammar) on questions of each family that training never shows, before and after a
fixed 20 steps. Before, it is about 1/K and below the bar for some family (checked, so the test can fail); after, it
must be at least 0.8 for *every* family, not on average.

What keeps the signal alive (a prototype with 4 completions per group lost it in a few steps): every step holds one
example of each family (batch_size = K over a K-example trainset), so the update can't get far by just preferring
one id: a push towards one family's worker is undone by the other's; 8 completions per group; reward 0 rather than
0.5 for "valid but wrong"; per-family evaluation. A cosine schedule stops AdamW's momentum from moving the weights
on once the groups score alike (their gradient is 0).

With three workers and three families (adding "Capitalise ...", lr 3e-3, ~20 s a step) it did not get there:
after 5 steps "Capitalise" questions went to their worker 4-21% of the time, and at step 9 two groups all scored 1
and one all scored 0 (mean reward 0.67, gradient 0), so no group carried any signal.

Measured on the 2-core machine with 2 torch threads: 3 min 46 s in all (about 5-14 s a training step, less once
groups score alike; each evaluation about 20 s). P(right worker) went from 0.69 (spell) and 0.34 (add) before to
1.00 and 0.875 after. With seed=1 instead of 0 (not what runs here): 1.00 and 1.00 after, in 3 min 30 s. At lr 3e-3
(the setting before groups shared their prompt in sampling, which changed the random draws) seed 0 collapsed at
step 6 to one worker for both families (0.0 and 1.0 after); 2e-3 met the bar on both seeds tried.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("xgrammar")

import dspy  # noqa: E402

from conductor.conductor_lm import ConductorLM, LoraSpec, WorkflowConstraint, WorkflowFormat  # noqa: E402
from conductor.modules import Conductor, WorkerPool  # noqa: E402
from conductor.optimizers._rewards import RewardConfig  # noqa: E402
from conductor.optimizers.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from conductor.testing import ScriptedWorker  # noqa: E402
from tests.conductor_lm.helpers import smollm2_or_skip  # noqa: E402

pytestmark = pytest.mark.slow

WORDS = ["cat", "dog", "sun", "tree", "fish", "bird", "lamp", "rock"]
FAMILIES = {
    "spell": (lambda i: f"Spell '{WORDS[i]}' backwards.", r"Spell '(\w+)' backwards", lambda m: m[1][::-1]),
    "add": (lambda i: f"Add {i + 3} and {2 * i + 5}.", r"Add (\d+) and (\d+)", lambda m: str(int(m[1]) + int(m[2]))),
}
RIGHT_WORKER = {"spell": 0, "add": 1}
"""Which worker id answers each family right."""
STEPS = 20
SAMPLES = 32
"""Samples per family for each probability estimate."""
BAR = 0.8


def solve(family: str, prompt: str) -> str:
    """The right answer to ``family``'s question in a worker prompt, or a wrong one for another family's."""
    pattern, answer = FAMILIES[family][1:]
    match = re.search(pattern, prompt.split("Your subtask")[0])  # the overall task, not the conductor's subtask
    return answer(match) if match else "I can't do that."


def example(family: str, i: int) -> dspy.Example:
    question = FAMILIES[family][0](i)
    answer = solve(family, question)
    return dspy.Example(question=question, answer=answer, family=family).with_inputs("question")


@pytest.fixture(scope="module")
def policy() -> ConductorLM:
    return smollm2_or_skip(lora=LoraSpec(r=8, alpha=16))


@pytest.fixture
def two_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def test_grpo_learns_which_worker_answers_each_family(policy: ConductorLM, tmp_path: Path, two_threads: None) -> None:
    families = list(FAMILIES)
    workers = [None] * len(families)
    for family in families:
        workers[RIGHT_WORKER[family]] = ScriptedWorker(f"worker{RIGHT_WORKER[family]}", lambda p, f=family: solve(f, p))
    pool = WorkerPool(workers)
    program = Conductor(pool, max_steps=1, fallback="none")
    program.orchestrate.signature = program.orchestrate.signature.with_instructions("Write a workflow.")
    form = WorkflowFormat(len(pool), 1, max_subtask_bytes=1)

    def constraint(_: Conductor | None = None, depth: int = 0) -> WorkflowConstraint:
        return WorkflowConstraint(
            policy.tokenizer, form, stop_token_ids=sorted(policy.eos_ids), vocab_size=policy.model.config.vocab_size
        )

    evaluation = {f: [example(f, i).question for i in range(4, 8)] for f in families}  # never trained on
    sampler = constraint()

    def p_right(seed: int) -> dict[str, float]:
        """Per family, the share of sampled workflows that send its questions to its own worker."""
        out = {}
        for family, questions in evaluation.items():
            rows = policy.sample(
                [program.prompt_messages(q) for q in questions],
                SAMPLES // len(questions),
                max_new_tokens=form.max_tokens(),
                temperature=1.0,
                seed=seed,
                logits_processor=sampler,
            )
            picks = [int(re.search(r"model_id = \[(\d+)\]", s.text)[1]) for row in rows for s in row]
            out[family] = sum(p == RIGHT_WORKER[family] for p in picks) / len(picks)
        return out

    before = p_right(seed=1)
    assert min(before.values()) < BAR, f"the untrained conductor already routes well: {before}"

    config = GRPOConfig(
        output_dir=tmp_path,
        steps=STEPS,
        batch_size=len(families),  # one example per family, every step
        group_size=8,
        lr=2e-3,
        schedule="cosine",
        warmup_ratio=0.0,
        max_new_tokens=form.max_tokens(),
        randomise_pool=False,
        checkpoint_every=STEPS,
        reward=RewardConfig(wrong=0.0),
        progress=False,
    )
    trainset = [example(f, 0) for f in families]
    trainer = GRPOTrainer(
        config, policy, program, trainset, lambda e, p: e.answer == p.answer, logits_processor=constraint
    )
    history = trainer.run()

    after = p_right(seed=2)
    rewards = [round(h["reward"], 2) for h in history]
    print(f"P(right worker) before {before}, after {after}; mean reward by step {rewards}")
    assert all(p >= BAR for p in after.values()), f"before {before}, after {after}; rewards by step {rewards}"
