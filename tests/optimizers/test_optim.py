"""``adamw_with_warmup``'s schedule: a step that updates never runs at learning rate 0, and without warmup it is
transformers' own schedule (the learning test's trajectory depends on it)."""

import pytest

from conductor.optimizers._optim import adamw_with_warmup, optimizer_step

torch = pytest.importorskip("torch")


def learning_rates(steps: int, warmup_ratio: float, schedule: str = "cosine") -> list[float]:
    """The learning rate each optimizer step of a run used, checking that the step moved the weight."""
    weight = torch.nn.Parameter(torch.zeros(3))
    optimizer, scheduler = adamw_with_warmup(
        [weight], lr=0.1, weight_decay=0.0, steps=steps, warmup_ratio=warmup_ratio, schedule=schedule
    )
    used = []
    for _ in range(steps):
        used.append(scheduler.get_last_lr()[0])
        before = weight.detach().clone()
        weight.sum().backward()
        optimizer_step(optimizer, scheduler, [weight], max_grad_norm=None)
        assert not torch.equal(weight.detach(), before), f"step {len(used) - 1} of {steps} did not update"
    return used


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
@pytest.mark.parametrize("warmup_ratio", [0.0, 0.03, 0.5, 0.99])
@pytest.mark.parametrize("steps", [1, 2, 4])
def test_no_step_of_a_short_run_has_learning_rate_zero(steps: int, warmup_ratio: float, schedule: str) -> None:
    assert min(learning_rates(steps, warmup_ratio, schedule)) > 0


def test_the_warmup_climbs_linearly_to_the_peak_then_decays() -> None:
    used = learning_rates(10, warmup_ratio=0.2)  # 2 warmup steps
    assert used[:3] == pytest.approx([0.1 / 3, 0.2 / 3, 0.1])
    assert used[2:] == sorted(used[2:], reverse=True) and used[-1] > 0
    assert learning_rates(4, warmup_ratio=0.5, schedule="constant") == pytest.approx([0.1 / 3, 0.2 / 3, 0.1, 0.1])


def test_without_warmup_the_schedule_is_transformers_cosine() -> None:
    transformers = pytest.importorskip("transformers")
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([weight], lr=0.1)
    theirs = transformers.get_cosine_schedule_with_warmup(optimizer, 0, 7)
    expected = []
    for _ in range(7):
        expected.append(theirs.get_last_lr()[0])
        optimizer.step()
        theirs.step()
    assert learning_rates(7, warmup_ratio=0.0) == expected
