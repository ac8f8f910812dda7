"""Adapters between DSPy signatures and the plain text that small models can follow.

Tiny local models can't emit DSPy's ``[[ ## field ## ]]`` markers, so:
- ``WorkerPromptAdapter`` renders a role signature as a plain-text prompt and takes the whole completion as the
  role's single output field; a step whose subtask is ``QUESTION_ALONE`` (under a worker's ``"plain"`` framing, any
  step that answers the whole question on its own) is the question alone, as a user would ask the model;
- ``WorkflowAdapter`` renders ``Orchestrate`` and reads the conductor's completion with the tolerant workflow parser.
Both are ordinary ``dspy.Adapter``s, so instructions and few-shot demos set by DSPy optimizers flow through them.

A demo is shown only when it holds what the prompt shows of it: a workflow for the conductor, the role's output for a
worker. DSPy's optimizers also give predictors *labeled* demos, the raw training examples (``LabeledFewShot``, and
``BootstrapFewShot``'s ``max_labeled_demos``): a question and its answer have no workflow to show, and showing the
answer as the conductor's reply would teach it to answer instead of planning, so such demos are skipped. Bootstrapped
demos are traces of real runs, so they hold the workflow the conductor wrote and each step's response.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import dspy
from dspy.utils.exceptions import AdapterParseError

from conductor.errors import ConfigError, WorkflowError
from conductor.modules.workflow._workflow import (
    ACCESS_ALL,
    ACCESS_LIST_FIELD,
    LIST_NAMES,
    MODEL_ID_FIELD,
    REASONING_FIELD,
    ROLES_FIELD,
    SUBTASKS_FIELD,
    Workflow,
)

WORKER_PREAMBLE = "You are solving one subtask within an overall task."
INPUT_TITLES = {"question": "Overall task", "context": "Earlier steps", "subtask": "Your subtask"}
"""The title of each input's section in a worker's prompt (the tools that read the prompt find its parts by them)."""
DIRECT_SUBTASK = "Answer the overall task directly and completely."
"""The subtask of a step that answers the question on its own (a single worker, a sample, a fallback)."""
QUESTION_ALONE = "The question alone."
"""The subtask that sends a step that sees no earlier step the question alone as the only user message, whatever the
worker's framing: how a conductor asks a model as a user would, step by step (program search teaches it where a
model answers better so)."""
WHOLE_QUESTION_SUBTASKS = frozenset(
    {
        DIRECT_SUBTASK.lower().rstrip("."),  # the library's own direct step
        "all",  # what small conductors write for "the whole task"
        "everything",
        "the question",
        "the whole question",
        "the task",
        "the whole task",
        "the overall task",
        "answer the question",
        "answer the overall task",
        QUESTION_ALONE.lower().rstrip("."),
    }
)
"""Subtasks (lower case, without end punctuation) that ask for the whole question: a step given one of them, or the
question itself, answers the question as it stands."""


def _render_inputs(signature: type[dspy.Signature], inputs: dict[str, Any], titles: dict[str, str]) -> str:
    parts = []
    for name in signature.input_fields:
        value = inputs.get(name)
        if value is None or value == "":
            continue
        title = titles.get(name, name.replace("_", " ").capitalize())
        parts.append(f"{title}:\n{value}")
    return "\n\n".join(parts)


def asks_whole_question(inputs: dict[str, Any]) -> bool:
    """Whether a step with these role inputs answers the question on its own: it sees no earlier step and its subtask
    (if its role has one) is the whole question (``WHOLE_QUESTION_SUBTASKS``, or the question itself)."""
    question, subtask = inputs.get("question"), inputs.get("subtask")
    if not question or inputs.get("context"):
        return False
    if subtask is None:
        return True
    words = _plain_words(subtask)
    return words in WHOLE_QUESTION_SUBTASKS or words == _plain_words(question)


def asks_question_alone(inputs: dict[str, Any]) -> bool:
    """Whether a step with these role inputs is to get the question alone: it answers the question on its own
    (``asks_whole_question``) and its subtask is ``QUESTION_ALONE``."""
    return asks_whole_question(inputs) and _plain_words(inputs.get("subtask")) == _plain_words(QUESTION_ALONE)


def _plain_words(text: Any) -> str:
    return " ".join(str(text).lower().split()).strip(" .!:;")


class WorkerPromptAdapter(dspy.Adapter):
    """A role signature as a plain-text chat: instructions as the system message, the inputs as one user message.

    ``framing`` is the worker's (``Worker.framing``). ``"task"`` is the prompt above for every step but one whose
    subtask is ``QUESTION_ALONE`` (``asks_question_alone``), which is the question alone as the only user message, as
    a user would call the model. Under ``"plain"`` so is every step that answers the whole question on its own
    (``asks_whole_question``). Any other step keeps the task framing, because it needs the titles to tell the question
    from the earlier steps and its subtask. So does a role with demos: they were recorded as task prompts, and the
    question alone would no longer be what a user sends."""

    FRAMINGS = ("task", "plain")
    """The framings a worker's prompt can take (``Worker.framing``)."""

    def __init__(self, framing: str = "task", **kwargs: Any):
        super().__init__(**kwargs)
        if framing not in self.FRAMINGS:
            raise ConfigError(f"framing must be one of {self.FRAMINGS}, not {framing!r}")
        self.framing = framing

    def format(self, signature, demos, inputs):
        demos = [demo for demo in demos if demo.get(self._output(signature)) is not None]
        alone = asks_whole_question(inputs) if self.framing == "plain" else asks_question_alone(inputs)
        if alone and not demos:
            return [{"role": "user", "content": str(inputs["question"])}]
        messages = [{"role": "system", "content": signature.instructions}]
        for demo in demos:
            messages.append({"role": "user", "content": self._user(signature, demo)})
            messages.append({"role": "assistant", "content": str(demo.get(self._output(signature), ""))})
        messages.append({"role": "user", "content": self._user(signature, inputs)})
        return messages

    def parse(self, signature, completion):
        return {self._output(signature): completion.strip()}

    @staticmethod
    def _user(signature, inputs) -> str:
        return f"{WORKER_PREAMBLE}\n\n{_render_inputs(signature, inputs, INPUT_TITLES)}"

    @staticmethod
    def _output(signature) -> str:
        return next(iter(signature.output_fields))


class WorkflowAdapter(dspy.Adapter):
    """``Orchestrate`` as plain text in, the paper's list format out, with workers by number or, given the pool's
    ``names`` (``names[i]`` is worker i), by name. ``completion`` and ``workflow`` keep the last raw text parsed and
    what it parsed into (None if it didn't), so use one adapter per call when calls run concurrently."""

    completion = ""
    workflow: Workflow | None = None

    def __init__(self, names: Sequence[str] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.names = tuple(names) if names is not None else None

    def format(self, signature, demos, inputs):
        system = f"{signature.instructions}\n\nAnswer in exactly this form:\n{format_example(self.names is not None)}"
        messages = [{"role": "system", "content": system}]
        for demo in (demo for demo in demos if is_workflow_demo(demo)):
            messages.append({"role": "user", "content": _render_inputs(signature, demo, {})})
            messages.append({"role": "assistant", "content": _workflow_of(demo).to_text(self.names)})
        messages.append({"role": "user", "content": _render_inputs(signature, inputs, {})})
        return messages

    def parse(self, signature, completion):
        self.completion, self.workflow = completion, None
        try:
            self.workflow = Workflow.parse(completion, self.names)
        except WorkflowError as exc:
            raise AdapterParseError(type(self).__name__, signature, completion, message=str(exc)) from exc
        return workflow_fields(self.workflow)


@functools.cache
def format_example(by_name: bool) -> str:
    """The workflow the system prompt shows as the form to answer in, its workers by number or by name."""
    example = Workflow.from_lists(
        [0, 1], ["<instruction for step 0>", "<instruction for step 1>"], [[], ACCESS_ALL], reasoning="<brief thoughts>"
    )
    return example.to_text(["<worker name>", "<worker name>"] if by_name else None)


def workflow_fields(workflow: Workflow) -> dict[str, Any]:
    """The ``Orchestrate`` output fields of a workflow (what a few-shot demo or a prediction holds)."""
    return {
        REASONING_FIELD: workflow.reasoning,
        MODEL_ID_FIELD: [s.worker for s in workflow.steps],
        SUBTASKS_FIELD: [s.subtask for s in workflow.steps],
        ACCESS_LIST_FIELD: [s.access if s.access == ACCESS_ALL else list(s.access) for s in workflow.steps],
        ROLES_FIELD: [s.role or "" for s in workflow.steps] if any(s.role for s in workflow.steps) else None,
    }


WORKFLOW_FIELDS = LIST_NAMES
"""The ``Orchestrate`` output fields a demo needs to show a workflow (``reasoning`` and ``roles`` are optional)."""


def is_workflow_demo(demo: Any) -> bool:
    """Whether ``demo`` holds a workflow (a bootstrapped trace does; a labeled question and answer doesn't)."""
    return all(demo.get(name) is not None for name in WORKFLOW_FIELDS)


def _workflow_of(fields: dict[str, Any]) -> Workflow:
    return Workflow.from_lists(
        list(fields[MODEL_ID_FIELD]),
        list(fields[SUBTASKS_FIELD]),
        list(fields[ACCESS_LIST_FIELD]),
        list(fields[ROLES_FIELD]) if fields.get(ROLES_FIELD) else None,
        reasoning=fields.get(REASONING_FIELD) or "",
    )
