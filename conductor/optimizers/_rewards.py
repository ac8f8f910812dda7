"""The reward for one executed workflow: the paper's progressive reward, optionally minus cost.

0 when the conductor's text is not a usable workflow (even if a fallback answered), ``wrong`` when it ran but the
user's metric says wrong, ``right`` when right; a metric in [0, 1] interpolates between the two, and a metric that
raises gives 0 (recorded, never fatal). Penalties for
cost, tokens and steps are subtracted so that the same accuracy at lower cost earns more. A run that recursed earns
a mix of its first round's reward and its final one (``recursive_reward``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import dspy
import pydantic

logger = logging.getLogger(__name__)

Metric = Callable[..., Any]


class RewardConfig(pydantic.BaseModel):
    """How outcomes become rewards. The defaults are the paper's (0 / 0.5 / 1, no penalties).

    The penalties (cost, tokens, steps) are charged in proportion to the metric: a right answer pays all of its own,
    a wrong one or a run with no answer none. Charged to every run, they make failing cheaply pay: in issue 26's pilot
    (GRPO on program search's warm start, step penalty 0.1, 1 in 5 samples right) a wrong one-step run earned more than
    a wrong two-step one, and in 3 GRPO steps the conductor dropped the `check` step that made arithmetic right. So
    they choose among right answers only, as ToolOrchestra's efficiency reward does for solved tasks.
    """

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    format_error: float = pydantic.Field(0.0, description="the reward of an unusable workflow (a format error)")
    wrong: float = pydantic.Field(
        0.5, description="the reward of a metric of 0; a score between 0 and 1 earns in proportion up to `right`"
    )
    right: float = pydantic.Field(1.0, description="the reward of a metric of 1 (a right answer)")
    failed: float | None = pydantic.Field(
        None,
        description="for a run that stopped with an error and no answer (a worker failed, the budget ran out); "
        "None: like any run that executed, by the metric",
    )
    cost_penalty: float = pydantic.Field(
        0.0, ge=0, description="subtracted per dollar spent by the workers, from the answers that earned (see above)"
    )
    token_penalty: float = pydantic.Field(
        0.0, ge=0, description="subtracted per 1,000 tokens of the run (a conductor's own included), likewise"
    )
    step_penalty: float = pydantic.Field(0.0, ge=0, description="subtracted per step run, likewise")
    first_round_weight: float = pydantic.Field(
        0.25, ge=0, le=1, description="the weight of a recursed run's first-round reward, the final one's being 1"
    )


@dataclass(frozen=True)
class Reward:
    """One rollout's reward and what it was made of (recorded per rollout in training metrics)."""

    value: float
    base: float
    penalty: float
    metric: float | None
    format_ok: bool
    steps: int
    tokens: int
    cost: float
    error: str | None = None
    first_round: float | None = None
    """When the run recursed: what its first round's answer alone would have earned."""
    final_round: float | None = None
    """When the run recursed: what its final answer earned (steps, tokens and cost of all rounds)."""


def score(example: dspy.Example, prediction: dspy.Prediction, metric: Metric, config: RewardConfig) -> Reward:
    """The reward of ``prediction`` (a ``Conductor`` output) for ``example``; ``recursive_reward`` when it recursed."""
    final = _score_answer(example, prediction, metric, config)
    rounds = prediction.get("rounds") or ()
    if len(rounds) < 2:
        return final
    return recursive_reward(_score_answer(example, rounds[0], metric, config), final, config.first_round_weight)


def recursive_reward(first: Reward, final: Reward, first_round_weight: float) -> Reward:
    """The reward of a run that recursed: ``(w * r_first + r_final) / (1 + w)`` with ``w = first_round_weight``.

    Our reading of the paper's "the first round's reward is discounted (0.2-0.25)": the first round's answer still
    earns, at weight ``w`` against the final answer's 1, so a recursive round pays when it improves the answer and
    costs when it spoils a right one. The other parts (penalty, steps, ...) are the final answer's.
    """
    value = (first_round_weight * first.value + final.value) / (1 + first_round_weight)
    return replace(final, value=value, first_round=first.value, final_round=final.value)


def _score_answer(example: dspy.Example, prediction: dspy.Prediction, metric: Metric, config: RewardConfig) -> Reward:
    """The reward of ``prediction``'s own answer, as if the run had ended with it."""
    error = prediction.error
    steps, tokens, cost = len(prediction.trace), prediction.tokens, prediction.cost
    if error is not None and error.kind == "format":
        return Reward(config.format_error, config.format_error, 0.0, None, False, steps, tokens, cost, str(error))
    if config.failed is not None and error is not None and not prediction.get("response"):
        # a tool that can't take the task (a calculator given a multiple-choice question) earns less than a model
        # that tried and was wrong: without this, routing data gives no reason to prefer the model
        return Reward(config.failed, config.failed, 0.0, None, True, steps, tokens, cost, str(error))
    try:
        value = float(metric(example, prediction))
    except Exception as exc:  # a user metric failing on one rollout must not end a training run: reward 0
        logger.warning("the metric raised on one rollout (reward 0): %s: %s", type(exc).__name__, exc)
        message = f"metric raised {type(exc).__name__}: {exc}"
        return Reward(0.0, 0.0, 0.0, None, True, steps, tokens, cost, message)
    message = str(error) if error is not None else None
    value = min(max(value, 0.0), 1.0)
    base = config.wrong + (config.right - config.wrong) * value
    charges = config.cost_penalty * cost + config.token_penalty * tokens / 1000 + config.step_penalty * steps
    penalty = charges * value
    return Reward(base - penalty, base, penalty, value, True, steps, tokens, cost, message)
