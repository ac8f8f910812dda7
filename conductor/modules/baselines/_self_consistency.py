"""``SelfConsistency``: sample one worker k times and keep the answer most samples agree on."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Hashable
from typing import Unpack

from conductor.errors import ConfigError
from conductor.modules._answer import extract_answer
from conductor.modules.baselines._pipeline import FixedPipeline
from conductor.modules.pool import WorkerPool
from conductor.modules.programs import DIRECT_SUBTASK, ProgramOptions
from conductor.modules.run import RunResult
from conductor.modules.workflow import Workflow

logger = logging.getLogger(__name__)


class SelfConsistency(FixedPipeline):
    """``k`` independent samples of worker ``worker`` (steps that see nothing), then a majority vote over their
    extracted answers; ties go to the earliest sample. The answer is the winning sample's response.

    The executor calls a worker at the worker's own temperature, so samples differ only when that is above 0
    (the default is 0.2). Each sample's subtask carries its number, so no two prompts are identical: a response
    cache can't hand one completion to every sample, and each sample is its own traceable call (the executor may
    run them side by side). If a step fails or the budget runs out, the run has no answer, as for every method.
    """

    def __init__(self, pool: WorkerPool, worker: int = 0, k: int = 5, **options: Unpack[ProgramOptions]):
        if k < 1:
            raise ConfigError(f"SelfConsistency needs k >= 1 samples, not {k}")
        samples = [(worker, "", f"{DIRECT_SUBTASK} (This is sample {i + 1} of {k}.)", []) for i in range(k)]
        super().__init__(pool, samples, **options)
        if k > 1 and pool[worker].temperature <= 0:
            logger.warning("%s samples at temperature 0: its %d samples may all be alike", pool[worker].name, k)

    def _run(self, workflow: Workflow, question: str) -> RunResult:
        result = super()._run(workflow, question)
        if result.error is None:
            outputs = [step.output or "" for step in result.steps]
            keys = [self._vote_key(output) for output in outputs]
            winner = max(Counter(keys).items(), key=lambda item: item[1])[0]  # max keeps the first of equal counts
            result.answer = outputs[keys.index(winner)]
        return result

    def _vote_key(self, response: str) -> Hashable:
        """What a sample votes for: its answer as the first output field reads it, compared without case or spacing."""
        annotation = next(iter(self.signature.output_fields.values())).annotation
        value = extract_answer(response, annotation)
        return " ".join(value.split()).casefold() if isinstance(value, str) else value
