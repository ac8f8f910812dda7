"""GRPO improves on an imperfect warm start: with a reward that charges each step, the real SmolLM2 conductor drops a
step that adds nothing (slow: loads the embedded model; 6.5 min on the 2 shared cores beside a training run).

Pool and kinds as ``kinds.py``: "add" questions are answered right by worker ``add`` alone, and as right by ``add``
twice (the second step adds the task's numbers again), one call dearer; "spell" questions by ``reverse`` alone. The
warm start teaches mostly the dear workflow for "add" (the cheap one on a quarter of its questions), as a search whose
ties fell by chance might. GRPO then trains on the same questions with ``RewardConfig.step_penalty``: a right answer
earns 1 less 0.25 a step, so ``add`` alone earns 0.75 and ``add -> add`` 0.5, while both are equally right.

The measure is the share of sampled workflows (temperature 1, under the workflow grammar) on questions training never
saw: for "add", right in one step; for "spell", right. Before GRPO the "add" share is under the bar (checked, so the
test can fail); after, both are at least 0.8: worker calls on "add" fall by close to half at equal accuracy.

Why the dear workflow repeats ``add`` rather than sending its answer to ``shout`` (capitals change no digit): taught
``add -> shout`` seeing step 0, the warm-started conductor wrote step 1's access list empty in 3 samples of 4, so
``shout`` had nothing to shout and the dear workflow was wrong; GRPO then raised accuracy by moving to another right
two-step workflow (``reverse -> add``), never to the cheaper one, and the test measured the access list, not the cost.
"""

from __future__ import annotations

import time
from pathlib import Path

import dspy
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("xgrammar")

from conductor.conductor_lm import LoraSpec  # noqa: E402
from conductor.modules import ConductorReply  # noqa: E402
from conductor.optimizers import WarmStartConfig, warm_start  # noqa: E402
from conductor.optimizers._rewards import RewardConfig  # noqa: E402
from conductor.optimizers.finetune import TemplateStep, template_workflow  # noqa: E402
from conductor.optimizers.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from tests.conductor_lm.helpers import smollm2_or_skip  # noqa: E402
from tests.optimizers.conducting_kinds import KindsConductor  # noqa: E402
from tests.optimizers.kinds import example, right  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.longest]  # starts first, beside test_grpo_learning.py

FAMILIES = ("add", "spell")
UNSEEN = range(1, 12, 3)
TRAINED_ON = [i for i in range(12) if i not in UNSEEN]
ADD = TemplateStep(worker="add", subtask="x", access=())
REVERSE = TemplateStep(worker="reverse", subtask="x", access=())


def taught(family: str, i: int) -> tuple[TemplateStep, ...]:
    """The warm start's workflow: "add" mostly its dear one (right, a step too many), its cheap one on every fourth
    question, as a search whose ties fell by chance would teach it."""
    if family == "spell":
        return (REVERSE,)
    return (ADD,) if i % 4 == 0 else (ADD, ADD)


SAMPLES = 8
BAR = 0.8


def test_grpo_finds_the_cheaper_workflow_of_equal_accuracy(tmp_path: Path, one_torch_thread: None) -> None:
    started = time.perf_counter()
    policy = smollm2_or_skip(lora=LoraSpec(r=8, alpha=16))
    kinds = KindsConductor.of(policy)
    program, pool = kinds.program, kinds.program.pool

    def cheap_where_right(e: dspy.Example, reply: ConductorReply, run: dspy.Prediction) -> bool:
        """Right, and for "add" in one step."""
        one_step = reply.workflow is not None and len(reply.workflow.steps) == 1
        return right(e, run) and (e.family == "spell" or one_step)

    def shares() -> dict[str, float]:
        return kinds.shares(FAMILIES, UNSEEN, samples=SAMPLES, seed=3, good=cheap_where_right)

    labelled = [(f, i, example(f, i)) for f in FAMILIES for i in TRAINED_ON]
    trainset = [e for _, _, e in labelled]
    examples = [(dict(e.inputs()), template_workflow(taught(f, i), pool.names), pool) for f, i, e in labelled]
    warm_start(policy, program, examples, WarmStartConfig(steps=24, batch_size=4, lr=1e-3, max_length=2048))
    before = shares()
    assert before["add"] < BAR, f"the warm start already writes the cheaper workflow: {before}"

    grpo = GRPOConfig(
        output_dir=tmp_path,
        steps=10,
        batch_size=len(FAMILIES),
        balance_by="family",
        group_size=8,
        resample_agreeing=2,  # groups that all agree carry no gradient: roll out others in their place
        lr=5e-4,
        schedule="cosine",
        warmup_ratio=0.0,
        max_new_tokens=kinds.form.max_tokens(),
        randomise_pool=False,
        checkpoint_every=10,
        reward=RewardConfig(wrong=0.0, step_penalty=0.25),
        progress=False,
    )
    history = GRPOTrainer(grpo, policy, program, trainset, right, logits_processor=kinds.constraint).run()
    after = shares()
    rewards = [round(h["reward"], 2) for h in history]
    print(f"before {before}, after {after}; rewards {rewards}; {time.perf_counter() - started:.0f} s")
    assert all(share >= BAR for share in after.values()), f"before {before}, after {after}; rewards {rewards}"
