"""The conductor the learning tests train over ``kinds.py``'s workers, and how they measure it: the share of sampled
workflows that do well on questions training never saw (needs torch: only the slow tests import it)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import dspy

from conductor.conductor_lm import ConductorLM, WorkflowConstraint, WorkflowFormat
from conductor.modules import Conductor, ConductorReply, WorkerPool
from tests.optimizers.kinds import example, workers

Good = Callable[[dspy.Example, ConductorReply, dspy.Prediction], bool]
"""``(example, reply, prediction) -> bool``: whether a sampled workflow did what the test asks."""


@dataclass(frozen=True)
class KindsConductor:
    """A conductor over the scripted workers writing at most two steps with one-byte subtasks under the workflow
    grammar, so that a completion's choices are the step count, the workers and the access lists."""

    policy: ConductorLM
    program: Conductor
    form: WorkflowFormat

    @classmethod
    def of(cls, policy: ConductorLM) -> KindsConductor:
        pool = WorkerPool(workers())
        program = Conductor(pool, max_steps=2, fallback="none")
        program.orchestrate.signature = program.orchestrate.signature.with_instructions("Write a workflow.")
        return cls(policy, program, WorkflowFormat(len(pool), 2, max_subtask_bytes=1))

    def constraint(self, _: Conductor | None = None, depth: int = 0) -> WorkflowConstraint:
        """The grammar's logits processor; with its arguments, what ``GRPOTrainer`` takes as ``logits_processor``."""
        policy = self.policy
        return WorkflowConstraint(
            policy.tokenizer,
            self.form,
            stop_token_ids=sorted(policy.eos_ids),
            vocab_size=policy.model.config.vocab_size,
        )

    def shares(
        self, families: Sequence[str], unseen: Iterable[int], *, samples: int, seed: int, good: Good
    ) -> dict[str, float]:
        """Per family, the share of ``samples`` workflows sampled (temperature 1, under the grammar) for each of
        its ``unseen`` questions that are ``good``."""
        sampler, program, out = self.constraint(), self.program, {}
        for family in families:
            examples = [example(family, i) for i in unseen]
            rows = self.policy.sample(
                [program.prompt_messages(e.question) for e in examples],
                samples,
                max_new_tokens=self.form.max_tokens(),
                temperature=1.0,
                seed=seed,
                logits_processor=sampler,
            )
            runs = []
            for e, row in zip(examples, rows, strict=True):
                for sample in row:
                    reply = program.read_completion(sample.text)
                    runs.append(good(e, reply, program.run_reply(e.question, reply)))
            out[family] = sum(runs) / len(runs)
        return out
