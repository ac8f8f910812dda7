"""The GRPO objective on crafted numbers: each test fails if the sign, the group normalisation or the clipping is
wrong. No model is needed."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from conductor.errors import ConfigError  # noqa: E402
from conductor.optimizers.grpo import GRPOConfig, group_advantages, grpo_loss, load_config  # noqa: E402
from conductor.optimizers.grpo._loss import pad  # noqa: E402


def test_advantages_are_normalised_within_each_group_and_follow_the_reward() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    advantages = group_advantages(rewards, eps=0.0 + 1e-12)
    std0 = math.sqrt(0.5 / 3)  # sample std of [1, 0, .5, .5]
    expected = torch.tensor([[0.5 / std0, -0.5 / std0, 0, 0], [0, 0, 0, 0], [-0.5, -0.5, -0.5, 1.5]])
    assert torch.allclose(advantages, expected, atol=1e-6)
    # a batch-wide normalisation would give the all-ones group non-zero advantages, a wrong sign would flip these
    assert advantages[0, 0] > 0 > advantages[0, 1] and advantages[2, 3] > 0


def test_a_group_that_scored_alike_gets_zeros_not_nan() -> None:
    advantages = group_advantages(torch.zeros(3, 8))
    assert torch.equal(advantages, torch.zeros(3, 8))
    eps_shrinks = group_advantages(torch.tensor([[0.0, 1.0]]), eps=1.0)[0].tolist()
    assert eps_shrinks == pytest.approx([-0.5 / (math.sqrt(0.5) + 1), 0.5 / (math.sqrt(0.5) + 1)])


def _grad(new: list[list[float]], old: list[list[float]], advantages: list[float], **kwargs):
    logprobs = torch.tensor(new, requires_grad=True)
    out = grpo_loss(logprobs, torch.tensor(old), torch.tensor(advantages), torch.ones_like(logprobs), **kwargs)
    out.loss.backward()
    return out, logprobs.grad


def test_at_ratio_one_the_gradient_raises_positive_and_lowers_negative_advantages() -> None:
    out, grad = _grad([[-1.0, -2.0], [-0.5, -0.5]], [[-1.0, -2.0], [-0.5, -0.5]], [2.0, -1.0])
    # loss = -mean_seq(mean_tok(ratio * A)); d loss / d logprob = -A * ratio / tokens / sequences
    assert out.loss.item() == pytest.approx(-(2.0 - 1.0) / 2)
    assert torch.allclose(grad, torch.tensor([[-0.5, -0.5], [0.25, 0.25]]))
    assert out.clip_fraction == 0.0 and out.kl == 0.0


@pytest.mark.parametrize(
    ("ratio", "advantage", "clipped"),
    [(1.5, 1.0, True), (0.5, 1.0, False), (1.5, -1.0, False), (0.5, -1.0, True)],
)
def test_clipping_stops_the_gradient_only_where_the_ratio_left_the_trust_region_in_the_advantages_direction(
    ratio: float, advantage: float, clipped: bool
) -> None:
    out, grad = _grad([[math.log(ratio)]], [[0.0]], [advantage], clip=0.2)
    bound = min(max(ratio, 0.8), 1.2)
    assert out.loss.item() == pytest.approx(-min(ratio * advantage, bound * advantage))
    assert grad.item() == pytest.approx(0.0 if clipped else -advantage * ratio)
    assert out.clip_fraction == (1.0 if clipped else 0.0)


def test_padding_is_ignored_and_each_sequence_weighs_the_same_whatever_its_length() -> None:
    rows = [torch.tensor([-1.0, -1.0, -1.0, -1.0]), torch.tensor([-2.0])]
    logprobs, mask = pad(rows)
    assert mask.tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]
    noisy = logprobs + (1 - mask) * 7.0  # whatever the padding holds
    advantages = torch.tensor([1.0, 1.0])
    out = grpo_loss(noisy, noisy.detach() + 0.1, advantages, mask)
    assert out.loss.item() == pytest.approx(-math.exp(-0.1))  # ratio exp(-0.1) on every real token


def test_the_kl_term_penalises_distance_to_the_reference() -> None:
    new, ref = [[math.log(0.5)]], [[math.log(0.25)]]
    out, grad = _grad(new, new, [0.0], beta=0.1, ref_logprobs=torch.tensor(ref))
    delta = math.log(0.25) - math.log(0.5)
    assert out.kl == pytest.approx(math.exp(delta) - delta - 1)
    assert out.loss.item() == pytest.approx(0.1 * out.kl)
    assert grad.item() > 0  # descending lowers the log-prob, towards the reference's lower one
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), beta=0.1)


def test_the_config_reports_every_problem_at_once(tmp_path) -> None:
    with pytest.raises(ConfigError) as error:
        load_config({"output_dir": tmp_path, "group_size": 1, "clip": 2, "lr": 0, "nonsense": True})
    message = str(error.value)
    for field in ("group_size", "clip", "lr", "nonsense"):
        assert field in message
    with pytest.raises(ConfigError, match="max_pool_size"):
        load_config({"output_dir": tmp_path, "min_pool_size": 3, "max_pool_size": 2})
    config = load_config({"output_dir": tmp_path})
    assert isinstance(config, GRPOConfig) and load_config(config) is config
    assert (config.clip, config.beta, config.temperature, config.randomise_pool) == (0.2, 0.0, 1.0, True)
