"""``WorkflowMetric``: the user's metric as DSPy's optimizers call it on ``Conductor`` predictions (prompt search,
budget tuning and the compiler score programs with it)."""

from __future__ import annotations

import logging

import dspy

from conductor.errors import ConductorError
from conductor.optimizers._rewards import Metric

logger = logging.getLogger(__name__)


class WorkflowMetric:
    """The user's ``metric(example, prediction)`` as DSPy's optimizers call it on ``Conductor`` predictions.

    Evaluating (no ``trace``), it is the metric's value for the answer. Bootstrapping (DSPy passes the ``trace``), it
    is 1.0 only when the conductor's own workflow ran (not the fallback after a format error) and the metric reached
    ``threshold``, so only such workflows become few-shot demos. A metric that raises scores 0 and is logged, as a
    rollout's reward does; ``check`` catches a metric that can't score at all. ``pred_name`` and ``pred_trace`` are
    GEPA's per-predictor arguments; the score is the whole run's.
    """

    def __init__(self, metric: Metric, threshold: float = 1.0):
        self.metric = metric
        self.threshold = threshold

    def __call__(
        self,
        example: dspy.Example,
        prediction: dspy.Prediction,
        trace: list | None = None,
        pred_name: str | None = None,
        pred_trace: list | None = None,
    ) -> float:
        if trace is not None and not _own_workflow_ran(prediction):
            return 0.0
        try:
            value = float(self.metric(example, prediction))
        except Exception as exc:  # one bad example must not end a search: it scores 0, as in training
            logger.warning("the metric raised (scored 0): %s: %s", type(exc).__name__, exc)
            return 0.0
        return value if trace is None else float(value >= self.threshold)

    def check(self, program: dspy.Module, example: dspy.Example) -> None:
        """Run ``program`` on ``example`` and raise ``ConductorError`` if the metric raises on the result: a metric
        that can't score would make every candidate score 0, and a search would silently keep its baseline."""
        prediction = program(**example.inputs())
        try:
            self.metric(example, prediction)
        except Exception as exc:
            raise ConductorError(
                f"the metric raised on the first example ({type(exc).__name__}: {exc}); fix it before searching"
            ) from exc


def _own_workflow_ran(prediction: dspy.Prediction) -> bool:
    error = prediction.get("error")
    return prediction.get("workflow") is not None and (error is None or error.kind != "format")
