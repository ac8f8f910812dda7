"""The workflow language the conductor writes: parse it tolerantly, validate it precisely, write it back.

A workflow is the paper's three equal-length lists, plus an optional fourth naming each step's role:

    model_id = [0, 2]
    subtasks = ["Write a plan for ...", "Follow the plan and ..."]
    access_list = [[], "all"]
    roles = ["plan", "solve"]          # optional; a step without a role uses the default role

Workers are named by their place in the pool, as in the paper, or, given the pool's ``names``, by name
(``model_id = ["gemma", "check"]``): a workflow by name keeps its meaning in a pool of another order or size.

Parsing (as reimplementations of the paper do it): drop a leading ``<think>...</think>``, find each name followed by
``:`` or ``=``, read the balanced ``[...]`` after it as a Python literal, else as JSON, else split it on commas.
Anything that can't become a workflow raises ``WorkflowError`` listing every problem, never a bare exception:
format errors are data (they earn reward 0 in training), not crashes.
"""

from __future__ import annotations

import json
import re
import reprlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, Union

from conductor.errors import WorkflowError
from conductor.modules._syntax import python_literal

# The text format's vocabulary, defined here once: ``to_text`` writes it, ``parse`` reads it, and the workflow grammar
# (``conductor.conductor_lm``) spells the same text with it.
REASONING_FIELD: Final = "reasoning"
MODEL_ID_FIELD: Final = "model_id"
SUBTASKS_FIELD: Final = "subtasks"
ACCESS_LIST_FIELD: Final = "access_list"
ROLES_FIELD: Final = "roles"
ACCESS_ALL: Final = "all"
"""The access keyword: the step sees every earlier step (``Access`` spells it as a type, which must be literal)."""
LIST_NAMES = (MODEL_ID_FIELD, SUBTASKS_FIELD, ACCESS_LIST_FIELD)
"""The lists every workflow has (``roles`` is optional)."""
TEXT_FIELDS = (REASONING_FIELD, *LIST_NAMES, ROLES_FIELD)
"""Every field of the text form, in the order ``to_text`` writes them."""

Access = Union[Literal["all"], tuple[int, ...]]  # noqa: UP007 - a type alias needs the runtime form
"""Which earlier steps a step sees: ``"all"`` of them (``ACCESS_ALL``), or the listed indices (``()`` for none)."""

# "2", "Model 2", "worker 2": an index. Longer digit strings are none (and past 4,300 digits Python can't read them).
_INDEX = re.compile(r"\s*(?:(?:model|worker|agent)\s*)?(-?\d{1,18})\s*", re.I)
_shown = reprlib.repr  # what the conductor wrote, shortened, in a problem message
_THINK = re.compile(r"^\s*<think>.*?(</think>|$)", re.DOTALL)
# A field name, optionally quoted or in markdown bold, then ':' or '=' and the opening of its value.
_FIELD = re.compile(rf"[\"'*`]{{0,3}}\b(?P<name>{'|'.join(TEXT_FIELDS)})\b[\"'*`]{{0,3}}\s*[:=]\s*(?P<open>[\[\"])")


@dataclass(frozen=True)
class Step:
    """One step: worker ``worker`` (an index into the pool) does ``subtask`` seeing the steps in ``access``."""

    worker: int
    subtask: str
    access: Access = ACCESS_ALL
    role: str | None = None


@dataclass(frozen=True)
class Limits:
    """Structural limits a workflow must respect (run-time budgets live in ``Budget``)."""

    max_steps: int = 5
    allow_empty: bool = False  # a recursive round may keep the previous answer by writing no steps


@dataclass(frozen=True)
class Workflow:
    """An ordered list of steps; the answer is the last step's response."""

    steps: tuple[Step, ...]
    reasoning: str = field(default="", compare=True)

    def __len__(self) -> int:
        return len(self.steps)

    # ---- reading -------------------------------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str, names: Sequence[str] | None = None) -> Workflow:
        """Read the conductor's text; raise ``WorkflowError`` with every format problem found. With ``names``
        (``names[i]`` is worker i), ``model_id`` may name workers as well as number them."""
        body = _THINK.sub("", text, count=1)
        values, spans = _scan_fields(body)
        reasoning = values.pop(REASONING_FIELD, None)
        if reasoning is None:
            first = min((start for start, _ in spans), default=len(body))
            reasoning = re.sub(rf"^\s*({REASONING_FIELD}|thoughts?)\s*[:=]", "", body[:first], flags=re.I).strip()
        missing = [name for name in LIST_NAMES if name not in values]
        if missing:
            raise WorkflowError([f"missing list: {name}" for name in missing], text=text)
        return cls.from_lists(
            values[MODEL_ID_FIELD],
            values[SUBTASKS_FIELD],
            values[ACCESS_LIST_FIELD],
            values.get(ROLES_FIELD),
            reasoning=reasoning,
            names=names,
        )

    @classmethod
    def from_lists(
        cls,
        model_id: list,
        subtasks: list,
        access_list: list,
        roles: list | None = None,
        *,
        reasoning: str = "",
        names: Sequence[str] | None = None,
    ) -> Workflow:
        """Build a workflow from the parsed lists, converting tolerantly ("Model 2" -> 2, "none" -> []); with
        ``names``, a worker's name is its index too."""
        lists = {MODEL_ID_FIELD: model_id, SUBTASKS_FIELD: subtasks, ACCESS_LIST_FIELD: access_list}
        if roles is not None:
            lists[ROLES_FIELD] = roles
        problems = [
            f"{name} is not a list: {_shown(value)}" for name, value in lists.items() if not isinstance(value, list)
        ]
        if problems:
            raise WorkflowError(problems)
        lengths = {name: len(value) for name, value in lists.items()}
        if len(set(lengths.values())) > 1:
            raise WorkflowError(["unequal lengths: " + ", ".join(f"{n}={k}" for n, k in lengths.items())])
        steps = []
        for i in range(lengths[MODEL_ID_FIELD]):
            worker, access = _as_worker(model_id[i], names), _as_access(access_list[i])
            if worker is None:
                known = f" or one of the names {', '.join(names)}" if names else ""
                problems.append(f"{MODEL_ID_FIELD}[{i}] is not a worker index{known}: {_shown(model_id[i])}")
            if access is None:
                problems.append(
                    f'{ACCESS_LIST_FIELD}[{i}] must be "{ACCESS_ALL}", [] or a list of step indices: '
                    f"{_shown(access_list[i])}"
                )
            role = None if roles is None else str(roles[i]).strip().lower() or None
            steps.append(Step(worker if worker is not None else -1, str(subtasks[i]), access or (), role))
        if problems:
            raise WorkflowError(problems)
        return cls(tuple(steps), reasoning)

    # ---- checking ------------------------------------------------------------------------------------------------
    def problems(self, n_workers: int, limits: Limits = Limits(), roles: set[str] | None = None) -> list[str]:
        """Every rule this workflow breaks for a pool of ``n_workers`` (empty when it is runnable)."""
        found = []
        if not self.steps and not limits.allow_empty:
            found.append("the workflow has no steps")
        if len(self.steps) > limits.max_steps:
            found.append(f"too many steps: {len(self.steps)} > max_steps={limits.max_steps}")
        for i, step in enumerate(self.steps):
            if not 0 <= step.worker < n_workers:
                found.append(f"step {i}: unknown worker {step.worker} (the pool has workers 0..{n_workers - 1})")
            if not step.subtask.strip():
                found.append(f"step {i}: empty subtask")
            if step.access != ACCESS_ALL:
                for j in step.access:
                    if not 0 <= j < i:
                        where = "itself" if j == i else "a later step" if j > i else "a negative index"
                        found.append(f"step {i}: access_list refers to {where} ({j}); only steps 0..{i - 1} exist")
            if roles is not None and step.role is not None and step.role not in roles:
                found.append(f"step {i}: unknown role {step.role!r} (known: {', '.join(sorted(roles))})")
        return found

    def validate(self, n_workers: int, limits: Limits = Limits(), roles: set[str] | None = None) -> Workflow:
        """Return ``self`` when runnable, else raise ``WorkflowError`` listing every problem."""
        found = self.problems(n_workers, limits, roles)
        if found:
            raise WorkflowError(found)
        return self

    def visible(self, index: int) -> tuple[int, ...]:
        """Indices of the earlier steps step ``index`` may see."""
        access = self.steps[index].access
        return tuple(range(index)) if access == ACCESS_ALL else tuple(access)

    def shape(self, worker_names: Sequence[str]) -> tuple[tuple[str, Access], ...]:
        """What the workflow does, without its subtasks: each step's worker by name (``worker_names[i]`` is Model i;
        a step past the pool, on the conductor itself, is "conductor") and the steps it sees."""
        return tuple(
            (worker_names[s.worker] if s.worker < len(worker_names) else "conductor", s.access) for s in self.steps
        )

    # ---- writing -------------------------------------------------------------------------------------------------
    def to_text(self, names: Sequence[str] | None = None) -> str:
        """The canonical text form, naming workers by ``names`` when given (``names[i]`` is worker i);
        ``Workflow.parse(w.to_text(names), names) == w``."""
        lines = [f"{REASONING_FIELD} = {json.dumps(self.reasoning, ensure_ascii=False)}"] if self.reasoning else []
        workers = [s.worker if names is None else names[s.worker] for s in self.steps]
        access = [s.access if s.access == ACCESS_ALL else list(s.access) for s in self.steps]
        lines += [
            f"{MODEL_ID_FIELD} = {json.dumps(workers, ensure_ascii=False)}",
            f"{SUBTASKS_FIELD} = {json.dumps([s.subtask for s in self.steps], ensure_ascii=False)}",
            f"{ACCESS_LIST_FIELD} = {json.dumps(access)}",
        ]
        if any(s.role is not None for s in self.steps):
            lines.append(f"{ROLES_FIELD} = {json.dumps([s.role or '' for s in self.steps], ensure_ascii=False)}")
        return "\n".join(lines)

    def to_mermaid(self, worker_names: list[str] | None = None) -> str:
        """A Mermaid flowchart: question -> steps (edges show what each step sees) -> answer, to paste into Markdown
        (GitHub, GitLab and MkDocs draw it); ``render_trace_html`` draws a run without Mermaid."""

        def label(text: str, limit: int = 60) -> str:
            text = " ".join(text.split())
            text = text if len(text) <= limit else text[: limit - 1] + "…"
            return text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")

        lines = ["flowchart TD", '    Q(["question"])']
        for i, step in enumerate(self.steps):
            worker = worker_names[step.worker] if worker_names and 0 <= step.worker < len(worker_names) else None
            head = f"{i} · Model {step.worker}" + (f" ({label(worker, 30)})" if worker else "")
            head += f" · {step.role}" if step.role else ""
            lines.append(f'    S{i}["{head}<br/>{label(step.subtask)}"]')
            lines.append(f"    Q --> S{i}")
            lines += [f"    S{j} --> S{i}" for j in self.visible(i) if 0 <= j < i]
        if self.steps:
            lines += ['    A(["answer"])', f"    S{len(self.steps) - 1} --> A"]
        return "\n".join(lines)


def _scan_fields(text: str) -> tuple[dict[str, object], list[tuple[int, int]]]:
    """Find each named field left to right, skipping over values already read (so a name quoted inside a subtask
    never counts). The first occurrence of a name wins."""
    values: dict[str, object] = {}
    spans: list[tuple[int, int]] = []
    pos = 0
    while (match := _FIELD.search(text, pos)) is not None:
        name, start = match["name"], match.start("open")
        end = _end_of_value(text, start)
        if end is None:  # unterminated: nothing after it can be trusted as a separate field
            break
        raw = text[start:end]
        if name not in values and (name == REASONING_FIELD) == (match["open"] == '"'):
            values[name] = _read_string(raw) if name == REASONING_FIELD else _read_list(raw)
            spans.append((match.start(), end))
        pos = end
    return values, spans


def _end_of_value(text: str, start: int) -> int | None:
    """Index just past the balanced ``[...]`` or the quoted string starting at ``start``; quotes inside lists are
    respected, so brackets in subtask strings don't count."""
    depth, quote, i = 0, None, start
    if text[start] == '"':
        quote, i = '"', start + 1
        while i < len(text):
            if text[i] == "\\":
                i += 2
                continue
            if text[i] == '"':
                return i + 1
            i += 1
        return None
    while i < len(text):
        char = text[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _read_list(raw: str) -> object:
    for reader in (python_literal, json.loads):
        try:
            return reader(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    inner = raw[1:-1].strip()
    return [item.strip().strip("\"'") for item in inner.split(",")] if inner else []


def _read_string(raw: str) -> str:
    try:
        return str(json.loads(raw))
    except ValueError:
        return raw.strip('"')


def _as_worker(value: object, names: Sequence[str] | None = None) -> int | None:
    if isinstance(value, str) and names:  # a name as written, else in any case
        name, folded = value.strip(), [n.lower() for n in names]
        if name in names:
            return list(names).index(name)
        if name.lower() in folded:
            return folded.index(name.lower())
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and (digits := _INDEX.fullmatch(value)):
        return int(digits[1])
    return None


def _as_access(value: object) -> Access | None:
    if isinstance(value, str):
        word = value.strip().lower()
        if word == ACCESS_ALL:
            return ACCESS_ALL
        if word in ("", "none", "[]"):
            return ()
        value = [value]
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, (list, tuple)):
        indices = [_as_worker(item) for item in value]
        return None if any(i is None for i in indices) else tuple(indices)
    return None
