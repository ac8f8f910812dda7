"""What the GRPO tests share: one torch thread, a logits processor that lets the tiny random model choose between a
few workflows, a scripted pool, and a tiny training run that a subprocess can start (``python -m``).

The tiny model almost never writes a valid workflow by itself, so every reward would be 0 and nothing would be
learnt. ``Choice`` lets it pick only the first token, among the first tokens of a few texts, from its own
distribution, and forces the rest of the chosen text: rewards vary, and GRPO changes which text it picks.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

import dspy  # noqa: E402

from conductor.conductor_lm import ConductorLM  # noqa: E402
from conductor.modules import Conductor, WorkerPool  # noqa: E402
from conductor.optimizers.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from conductor.testing import ScriptedWorker  # noqa: E402


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """Every test here runs with one torch thread (see tests/conftest.py)."""


def workflow(worker: int) -> str:
    return f'model_id = [{worker}]\nsubtasks = ["Go."]\naccess_list = [[]]'


RIGHT, WRONG, BROKEN = "A " + workflow(0), "B " + workflow(1), "CXYZ"
"""With ``pool()`` and ``randomise_pool=False``: reward 1, 0.5 and 0 (format error). ``BROKEN`` shares no token
with the others but end-of-sequence, so an update that raises one and lowers the other shows in their log-probs."""


class Choice:
    """The model picks each row's first token among the options' first tokens (from its own probabilities); the
    rest of that option and end-of-sequence are forced. A new generation is recognised as in ``ForceText``."""

    def __init__(self, policy: ConductorLM, texts: list[str]):
        eos = min(policy.eos_ids)
        self.options = {}
        for text in texts:
            ids = [*policy.tokenizer(text, add_special_tokens=False)["input_ids"], eos]
            self.options[ids[0]] = ids
        if len(self.options) != len(texts):
            raise ValueError("the options must start with different tokens")
        self.start, self.last = 0, None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        if self.last is None or length != self.last + 1:
            self.start = length
        self.last = length
        done = length - self.start
        out = torch.full_like(scores, float("-inf"))
        for row in range(input_ids.shape[0]):
            if done == 0:
                firsts = list(self.options)
                out[row, firsts] = scores[row, firsts]
            else:
                option = self.options[int(input_ids[row, self.start])]
                out[row, option[min(done, len(option) - 1)]] = 0.0
        return out


def choice(policy: ConductorLM, texts: list[str] | None = None) -> Any:
    """A ``ProcessorFactory`` giving every pool and round a ``Choice`` among ``texts`` (default: right, wrong,
    broken)."""
    return lambda conductor, depth: Choice(policy, texts or [RIGHT, WRONG, BROKEN])


def pool(**kwargs: Any) -> WorkerPool:
    """Worker 0 answers 4 (right), worker 1 answers 5 (wrong)."""
    return WorkerPool([ScriptedWorker("right", lambda _: "4", **kwargs), ScriptedWorker("wrong", lambda _: "5")])


def tiny() -> ConductorLM:
    """The tiny policy, adapter included, the same every time (peft draws LoRA's initial weights from the global
    RNG, which ``ConductorLM.tiny(seed)`` does not seed)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return ConductorLM.tiny(seed=0)


def program(workers: WorkerPool | None = None) -> Conductor:
    """A Conductor with one-line instructions: short prompts keep the tests fast, and the rollouts must use them."""
    conductor = Conductor(workers or pool())
    conductor.orchestrate.signature = conductor.orchestrate.signature.with_instructions("Write a workflow.")
    return conductor


def trainset(n: int = 4) -> list[dspy.Example]:
    return [dspy.Example(question=f"Question {i}: what is 2+2?", answer="4").with_inputs("question") for i in range(n)]


def exact(example: dspy.Example, prediction: dspy.Prediction) -> bool:
    return example.answer == prediction.answer


def config(output_dir: Path, **overrides: Any) -> GRPOConfig:
    """A tiny, fast run: 2 examples x 4 workflows a step, a high learning rate, no warmup, no progress bar."""
    settings: dict[str, Any] = {
        "output_dir": output_dir,
        "steps": 2,
        "batch_size": 2,
        "group_size": 4,
        "lr": 5e-3,
        "warmup_ratio": 0.0,
        "max_new_tokens": 64,
        "randomise_pool": False,
        "progress": False,
    }
    return GRPOConfig(**(settings | overrides))


def trainer(
    output_dir: Path, *, metric: Any = exact, workers: WorkerPool | None = None, **overrides: Any
) -> GRPOTrainer:
    """A trainer over a fresh tiny policy (the same weights every time)."""
    policy = tiny()
    return GRPOTrainer(
        config(output_dir, **overrides),
        policy,
        program(workers),
        trainset(),
        metric,
        logits_processor=choice(policy),
    )


def step_examples(run: GRPOTrainer, step: int) -> list[tuple[int, dspy.Example]]:
    """The ``(index, example)`` pairs of ``step`` (1-based) in a run that resamples nothing: its own slice of the
    epoch orders."""
    size = run.config.batch_size
    return run.examples_at((step - 1) * size, size)


KILL_TEST_RUN = {
    "steps": 5,
    "checkpoint_every": 2,
    "randomise_pool": True,
    "min_pool_size": 1,
    "group_size": 2,  # small groups agree now and then: steps 1 and 3 resample
    "resample_agreeing": 1,
}


def main(output_dir: str, resume: str) -> None:
    """The kill test's training run, in its own process."""
    torch.set_num_threads(1)
    trainer(Path(output_dir), resume=resume == "resume", **KILL_TEST_RUN).run()


if __name__ == "__main__":
    main(*sys.argv[1:])
