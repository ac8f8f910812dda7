"""Tool workers: any Python callable, ``dspy.Tool`` or ``dspy.Module`` as a worker.

Tools take part in a workflow like any model: the conductor hands them a subtask in plain text, and they answer with
text. Each tool picks what it needs out of the prompt (a code block, an expression) with its ``extract`` function, or
takes the step's subtask as it is. The built-in tools (the sandboxed Python runner, the calculator, vote and check)
live in ``conductor.modules.tools``. ``as_worker`` turns what a DSPy user already has into a worker.

A tool runs through a ``dspy.Tool``, so DSPy callbacks (and MLflow's autolog) see each call as a tool call. A
``TypeError`` from a tool or module is a bug (a wrong signature, a wrong type), not a passing failure: it is not
retried and doesn't cool the worker down.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable
from typing import Any, Literal

import dspy

from conductor.errors import ConfigError, WorkerError
from conductor.modules.workers._worker import Completion, Messages, Worker

TRUNCATED = "[output truncated]"


def _identity(text: str) -> str:
    return text


def _fit(text: str, max_tokens: int) -> str:
    """Cut ``text`` so its estimate (1 token per 3 characters) fits ``max_tokens``, marking the cut where it fits."""
    budget = max(max_tokens, 0) * 3
    if len(text) <= budget:
        return text
    marker = f"\n{TRUNCATED}"
    if budget >= 2 * len(marker):
        return text[: budget - len(marker)] + marker
    return text[:budget]


def _last_user_message(name: str, messages: Messages) -> str:
    text = next((m["content"] for m in reversed(messages) if m["role"] == "user"), None)
    if text is None:
        raise WorkerError(f"{name}: no user message to answer")
    return text


def _call(name: str, call: Callable[[], Any]) -> Any:
    """``call()``, with what it raises as a ``WorkerError`` naming the worker; a ``TypeError`` is not retryable."""
    try:
        return call()
    except WorkerError as exc:  # keep the kind (and so whether a retry can help), add the worker's name
        raise type(exc)(f"{name}: {exc}", retryable=exc.retryable) from exc
    except TypeError as exc:
        raise WorkerError(f"{name}: TypeError: {exc} (a bug in the call, not retried)", retryable=False) from exc
    except Exception as exc:
        raise WorkerError(f"{name}: {type(exc).__name__}: {exc}") from exc


def _text_tool(fn: Callable[[str], Any]) -> Callable[..., Any]:
    def run(text):  # no annotation: dspy.Tool then neither validates nor converts the text on each call
        return fn(text)

    return run


def _tool_arguments(tool: dspy.Tool, text: str) -> dict[str, Any]:
    """The arguments of ``tool`` for ``text``: the text itself for a tool of one argument, else a JSON object."""
    if len(tool.args) == 1:
        return {next(iter(tool.args)): text}
    if not tool.args:
        return {}
    try:
        arguments = json.loads(text)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise WorkerError(
            f"the tool takes the arguments {list(tool.args)}: the subtask must be a JSON object that names them",
            retryable=False,
        )
    return arguments


class ToolWorker(Worker):
    """A worker that answers with ``fn`` (a callable of one text, or any ``dspy.Tool``) applied to its input.

    ``reads`` picks the input: ``"prompt"``, the whole last user message (the overall task, the earlier steps and
    the subtask), or ``"subtask"``, the step's subtask alone. ``extract`` then picks the tool's input out of that
    (default: all of it). A ``dspy.Tool`` of several arguments takes them from a JSON object. ``fn`` may return any
    object; its ``str`` is the answer. Tools have no tokenizer, so token counts are estimates, and the answer is cut
    to fit ``max_tokens``. Whatever ``fn`` or ``extract`` raises becomes a ``WorkerError`` naming the worker.
    """

    def __init__(
        self,
        name: str,
        fn: Callable[[str], Any] | dspy.Tool,
        *,
        extract: Callable[[str], str] | None = None,
        reads: Literal["prompt", "subtask"] = "prompt",
        **worker_kwargs: Any,
    ):
        super().__init__(name, **worker_kwargs)
        self.extract = extract or _identity
        self.reads = reads
        self.tool = fn if isinstance(fn, dspy.Tool) else dspy.Tool(_text_tool(fn), name=name, desc=self.description)

    def complete(self, messages: Messages, *, max_tokens: int, temperature: float) -> Completion:
        return self._answer(_last_user_message(self.name, messages), messages, max_tokens)

    def complete_step(
        self, inputs: dict[str, str], messages: Messages, *, max_tokens: int, temperature: float
    ) -> Completion:
        if self.reads == "subtask" and "subtask" in inputs:
            return self._answer(inputs["subtask"], messages, max_tokens)
        return self.complete(messages, max_tokens=max_tokens, temperature=temperature)

    def _answer(self, text: str, messages: Messages, max_tokens: int) -> Completion:
        answer = str(_call(self.name, lambda: self.tool(**_tool_arguments(self.tool, self.extract(text)))))
        answer = _fit(answer, max_tokens)
        return Completion(answer, self.count_tokens(messages), math.ceil(len(answer) / 3))


class ModuleWorker(Worker):
    """A ``dspy.Module`` as a worker: called with the step's inputs (those its signature, or its ``forward``, takes),
    its output field is the answer (the last one when it has several: ``ChainOfThought``'s ``reasoning`` comes
    first). Outside a step (``complete``), the last user message is its ``question``.

    Like a tool's, token counts are estimates of the prompt and the answer, and the answer is cut to fit
    ``max_tokens``. The LM calls the module makes are its own: they don't count in a run's budget (DSPy's usage
    tracking still sees them), so give the worker a ``price`` per estimated token if a cost limit should cover it.
    """

    def __init__(self, name: str, module: dspy.Module, **worker_kwargs: Any):
        super().__init__(name, **worker_kwargs)
        self.module = module

    def complete(self, messages: Messages, *, max_tokens: int, temperature: float) -> Completion:
        question = _last_user_message(self.name, messages)
        return self.complete_step({"question": question}, messages, max_tokens=max_tokens, temperature=temperature)

    def complete_step(
        self, inputs: dict[str, str], messages: Messages, *, max_tokens: int, temperature: float
    ) -> Completion:
        signature = self._signature()
        if signature is not None:
            inputs = {k: v for k, v in inputs.items() if k in signature.input_fields}
        else:
            parameters = inspect.signature(self.module.forward).parameters
            if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
                inputs = {k: v for k, v in inputs.items() if k in parameters}
        prediction = _call(self.name, lambda: self.module(**inputs))
        answer = _fit(str(self._output(prediction, signature)), max_tokens)
        return Completion(answer, self.count_tokens(messages), math.ceil(len(answer) / 3))

    def _signature(self) -> type[dspy.Signature] | None:
        """The module's signature: its own, or its one predictor's (``ChainOfThought``); ``None`` if it has none."""
        predictors = self.module.predictors()
        return predictors[0].signature if len(predictors) == 1 else getattr(self.module, "signature", None)

    def _output(self, prediction: Any, signature: type[dspy.Signature] | None) -> Any:
        if not isinstance(prediction, dspy.Prediction):
            return prediction
        names = [n for n in signature.output_fields if n in prediction] if signature else list(prediction.keys())
        if not names:
            raise WorkerError(f"{self.name}: the module's prediction has no output field", retryable=False)
        return prediction[names[-1]]


def as_worker(obj: Worker | dspy.Tool | dspy.Module | Callable[[str], Any], **worker_kwargs: Any) -> Worker:
    """``obj`` as a worker: a ``Worker`` as it is; a ``dspy.Tool`` or a plain callable as a ``ToolWorker`` that gets
    the step's subtask; any ``dspy.Module`` as a ``ModuleWorker``. ``worker_kwargs`` are ``Worker``'s options
    (``name``, ``description``, ``price``, ``max_tokens``, ...); the name defaults to the tool's, the function's or the
    module class's (in lower case)."""
    if isinstance(obj, Worker):
        if worker_kwargs:
            raise ConfigError(f"{obj!r} is a worker already: set {sorted(worker_kwargs)} on it directly")
        return obj
    if isinstance(obj, dspy.Tool):
        worker_kwargs = {"name": obj.name, "description": obj.desc or "", **worker_kwargs}
        return ToolWorker(fn=obj, reads="subtask", **worker_kwargs)
    if isinstance(obj, dspy.Module):
        return ModuleWorker(module=obj, **{"name": type(obj).__name__.lower(), **worker_kwargs})
    if callable(obj):
        name = getattr(obj, "__name__", type(obj).__name__)
        worker_kwargs = {"name": name, "description": (inspect.getdoc(obj) or "").strip(), **worker_kwargs}
        return ToolWorker(fn=obj, reads="subtask", **worker_kwargs)
    raise ConfigError(f"{obj!r} can't be a worker: give a Worker, a dspy.Tool, a dspy.Module or a callable")
