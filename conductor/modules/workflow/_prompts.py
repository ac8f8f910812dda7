"""Adapters between DSPy signatures and the plain text that small models can follow.

Tiny local models can't emit DSPy's ``[[ ## field ## ]]`` markers, so:
- ``WorkerPromptAdapter`` renders a role signature as a plain-text prompt and takes the whole completion as the
  role's single output field;
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

from conductor.errors import WorkflowError
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


def _render_inputs(signature: type[dspy.Signature], inputs: dict[str, Any], titles: dict[str, str]) -> str:
    parts = []
    for name in signature.input_fields:
        value = inputs.get(name)
        if value is None or value == "":
            continue
        title = titles.get(name, name.replace("_", " ").capitalize())
        parts.append(f"{title}:\n{value}")
    return "\n\n".join(parts)


class WorkerPromptAdapter(dspy.Adapter):
    """A role signature as a plain-text chat: instructions as the system message, the inputs as one user message."""

    def format(self, signature, demos, inputs):
        messages = [{"role": "system", "content": signature.instructions}]
        for demo in (demo for demo in demos if demo.get(self._output(signature)) is not None):
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
