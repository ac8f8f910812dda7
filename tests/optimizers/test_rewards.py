import dspy
import pytest

from conductor.modules import RunError, StepTrace
from conductor.optimizers import RewardConfig, score

EXAMPLE = dspy.Example(question="2+2?", answer="4").with_inputs("question")


def exact(example, prediction, trace=None):
    return example.answer == prediction.answer


def prediction(answer="4", error=None, steps=2, tokens=1000, cost=0.01):
    trace = [StepTrace(i, 0, "w", "solve", "s", ()) for i in range(steps)]
    return dspy.Prediction(answer=answer, error=error, trace=trace, tokens=tokens, cost=cost)


def test_the_papers_progressive_reward():
    config = RewardConfig()
    assert score(EXAMPLE, prediction("4"), exact, config).value == 1.0
    assert score(EXAMPLE, prediction("5"), exact, config).value == 0.5
    unusable = score(EXAMPLE, prediction("4", RunError("format", "missing list: model_id")), exact, config)
    assert unusable.value == 0.0 and not unusable.format_ok  # a fallback's right answer earns nothing


def test_a_run_that_failed_is_scored_by_the_metric_like_any_executed_run():
    failed = prediction("", RunError("execution", "worker died"))
    reward = score(EXAMPLE, failed, exact, RewardConfig())
    assert reward.value == 0.5 and reward.format_ok and "worker died" in reward.error


def test_a_failed_run_can_earn_less_than_a_wrong_answer():
    config = RewardConfig(wrong=0.5, failed=0.0, step_penalty=0.1)
    failed = score(EXAMPLE, prediction("", RunError("execution", "no arithmetic expression")), exact, config)
    assert failed.value == 0.0 and failed.base == 0.0 and failed.metric is None and failed.penalty == 0.0
    assert "no arithmetic expression" in failed.error and failed.format_ok
    assert score(EXAMPLE, prediction("5"), exact, config).value == 0.5  # wrong but answered


def test_penalties_are_subtracted_from_a_right_answer_and_recorded():
    config = RewardConfig(cost_penalty=10, token_penalty=0.1, step_penalty=0.05)
    reward = score(EXAMPLE, prediction("4", steps=2, tokens=1000, cost=0.01), exact, config)
    assert reward.penalty == pytest.approx(10 * 0.01 + 0.1 * 1 + 0.05 * 2)
    assert reward.value == pytest.approx(1.0 - reward.penalty) and reward.base == 1.0


def test_penalties_never_make_failing_cheaply_pay():
    """A wrong answer pays no charge, so a wrong one-step run earns no more than a wrong two-step one (charged, the
    conductor in issue 26's pilot learned to drop the step that made its answers right); a partly right answer pays
    in proportion."""
    config = RewardConfig(wrong=0.0, step_penalty=0.1)
    wrong = [score(EXAMPLE, prediction("5", steps=n), exact, config) for n in (1, 2)]
    assert [r.value for r in wrong] == [0.0, 0.0] and all(r.penalty == 0.0 for r in wrong)
    right = [score(EXAMPLE, prediction("4", steps=n), exact, config).value for n in (1, 2)]
    assert right == pytest.approx([0.9, 0.8])  # of two right workflows, the cheaper earns more
    assert score(EXAMPLE, prediction(steps=2), lambda e, p: 0.5, config).value == pytest.approx(0.5 - 0.1)


def test_fractional_metric_interpolates_and_out_of_range_is_clipped():
    config = RewardConfig(wrong=0.2)
    assert score(EXAMPLE, prediction(), lambda e, p: 0.5, config).value == pytest.approx(0.6)
    assert score(EXAMPLE, prediction(), lambda e, p: 7, config).value == 1.0


def test_a_metric_that_raises_gives_reward_zero_and_says_why():
    def broken(example, prediction):
        raise KeyError("label")

    reward = score(EXAMPLE, prediction(), broken, RewardConfig())
    assert reward.value == 0.0 and reward.metric is None and "KeyError" in reward.error


def recursed(first: dspy.Prediction, final: dspy.Prediction) -> dspy.Prediction:
    """``final`` as the prediction of a run whose first round gave ``first``."""
    return dspy.Prediction(**final.toDict(), rounds=[first, final])


@pytest.mark.parametrize(
    "first, final, weight, rewards, value",
    [
        (prediction("5"), prediction("4"), 0.25, (0.5, 1.0), 0.9),  # the recursive round fixed the answer
        (prediction("4"), prediction("5"), 0.25, (1.0, 0.5), 0.6),  # it spoiled a right one
        (prediction("4"), prediction("4", RunError("format", "x")), 0.25, (1.0, 0.0), 0.2),  # it was unusable
        (prediction("5"), prediction("4"), 0.2, (0.5, 1.0), 1.1 / 1.2),
    ],
)
def test_a_recursed_run_earns_the_weighted_mean_of_its_first_and_final_rounds(first, final, weight, rewards, value):
    reward = score(EXAMPLE, recursed(first, final), exact, RewardConfig(first_round_weight=weight))
    assert reward.value == pytest.approx(value) and (reward.first_round, reward.final_round) == rewards


def test_a_run_of_one_round_earns_its_own_reward():
    single = prediction("5")
    reward = score(EXAMPLE, dspy.Prediction(**single.toDict(), rounds=[single]), exact, RewardConfig())
    assert reward.value == 0.5 and reward.first_round is None and reward.final_round is None
