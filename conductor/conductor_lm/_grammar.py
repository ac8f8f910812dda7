"""Constrained decoding: every sampled completion is a valid workflow for a given pool, so RL spends its signal on
*which* worker and *what* instruction rather than on the format.

``WorkflowFormat`` says what the grammar allows and writes it in xgrammar's EBNF; ``WorkflowConstraint`` is a
transformers ``LogitsProcessor`` that masks every token that would leave the grammar. The grammar matches exactly the
canonical text of ``Workflow.to_text()``, for workflows whose strings start with a non-blank character and hold no
control characters, and whose index lists increase::

    reasoning = "..."                  # only with reasoning=True
    model_id = [0, 2]                  # or by name, with worker_names: ["gemma", "check"]
    subtasks = ["Write a plan for ...", "Follow the plan and ..."]
    access_list = [[], "all"]
    roles = ["plan", "solve"]          # only when roles are given

then end-of-sequence. Equal list lengths are enforced by one alternative per length (``root ::= wf1 | wf2 | ...``).
The field names and the access keyword ``"all"`` are the workflow language's own (``conductor.modules.workflow``), so
the grammar and ``to_text`` spell them alike.

For a recursive conductor (``Conductor.max_depth > 0``) each round has its grammar (``round_format``): while a round is
left, the last of two or more steps may name the conductor itself (worker ``n_workers``, ``conductor_step``); in a
recursive round the lists may be empty (``allow_empty``: keep the previous answer), written
``model_id = []\nsubtasks = []\naccess_list = []``.

Strings are bounded in UTF-8 *bytes* as written between the quotes, not in characters: every token of a byte-level
tokenizer covers at least one byte, so a byte bound is what bounds the tokens of a completion (``max_tokens``), and
``fit`` picks the subtask bound from a ``max_new_tokens`` budget so that no sample is ever cut short. xgrammar's
``{m,n}`` repetition counts characters, so the bound is a chain of rules ``tailK`` (any text of at most K
bytes), each choosing a character of one to four bytes and continuing with ``tail{K - width}``.

xgrammar is imported lazily (``pip install xgrammar``); only compiling and matching need it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from transformers import LogitsProcessor

from conductor.errors import ConfigError, MissingDependency
from conductor.local import trainable_policy
from conductor.modules import SELF_NAME, Step, Workflow
from conductor.modules.workflow import (
    ACCESS_ALL,
    ACCESS_LIST_FIELD,
    MODEL_ID_FIELD,
    REASONING_FIELD,
    ROLES_FIELD,
    SUBTASKS_FIELD,
    Access,
)

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install xgrammar"

# Characters a string may hold, by UTF-8 width: printable ASCII but '"' and '\', then the escapes '\"' and '\\',
# then every other code point but C0/C1 controls and surrogates. Controls (newlines included) would need JSON
# escapes such as '\n', which the grammar leaves out: a subtask is one line.
_RANGES = {
    1: ((0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E)),
    2: ((0xA0, 0x7FF),),
    3: ((0x800, 0xD7FF), (0xE000, 0xFFFF)),
    4: ((0x10000, 0x10FFFF),),
}
_ESCAPES = ('"\\\\\\""', '"\\\\\\\\"')  # the EBNF literals for the two-byte texts \" and \\
_SPACES = frozenset(c for c in range(0x3001) if chr(c).isspace())
"""Whitespace as ``str.isspace`` sees it (no code point above U+3000 is)."""


def _code(c: int) -> str:
    return f"\\u{c:04x}" if c <= 0xFFFF else f"\\U{c:08x}"


def _char_class(width: int, *, blank: bool) -> str:
    """An EBNF alternative of the ``width``-byte characters (and escapes), without whitespace unless ``blank``."""
    ranges: list[tuple[int, int]] = []
    for low, high in _RANGES[width]:
        start = low
        for space in () if blank else sorted(c for c in _SPACES if low <= c <= high):
            if start < space:
                ranges.append((start, space - 1))
            start = space + 1
        if start <= high:
            ranges.append((start, high))
    text = "[" + "".join(_code(a) if a == b else f"{_code(a)}-{_code(b)}" for a, b in ranges) + "]"
    return " | ".join([text, *_ESCAPES]) if width == 2 else text


@dataclass(frozen=True)
class WorkflowFormat:
    """What the workflow grammar allows: workers ``0..n_workers-1``, 1 to ``max_steps`` steps, and so on.

    ``access="binary"`` allows ``"all"`` or ``[]`` per step (the paper's main setting); ``"indices"`` also allows
    lists of earlier steps in increasing order. With ``roles``, the ``roles`` list is required and holds only these
    (lower-case, as ``Workflow.parse`` normalises them). ``max_subtask_bytes`` and ``max_reasoning_bytes`` bound the
    strings in UTF-8 bytes as written (so ``\\"`` counts 2); subtasks and reasoning must start with a non-blank
    character, so ``Workflow.validate`` never finds an empty one.

    ``worker_names`` (one per worker) makes the workflow name workers instead of numbering them, as a
    ``Conductor(worker_ids="names")`` reads them. ``conductor_step`` lets the last step of two or more name worker
    ``n_workers`` (by name ``SELF_NAME``), the conductor itself (a recursive round follows); ``allow_empty`` allows
    the workflow of no steps (a recursive round keeping the previous answer), without a ``roles`` line, as
    ``Workflow.to_text`` writes it.
    """

    n_workers: int
    max_steps: int
    roles: tuple[str, ...] | None = None
    access: Literal["binary", "indices"] = "binary"
    reasoning: bool = False
    max_subtask_bytes: int = 200
    max_reasoning_bytes: int = 400
    conductor_step: bool = False
    allow_empty: bool = False
    worker_names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.roles is not None:
            object.__setattr__(self, "roles", tuple(self.roles))
        if self.worker_names is not None:
            object.__setattr__(self, "worker_names", tuple(self.worker_names))
        problems = [
            f"{name} must be at least 1, got {value}"
            for name, value in (
                ("n_workers", self.n_workers),
                ("max_steps", self.max_steps),
                ("max_subtask_bytes", self.max_subtask_bytes),
                ("max_reasoning_bytes", self.max_reasoning_bytes),
            )
            if value < 1
        ]
        if self.worker_names is not None and len(self.worker_names) != self.n_workers:
            problems.append(f"worker_names must name each of the {self.n_workers} workers, got {self.worker_names}")
        if self.access not in ("binary", "indices"):
            problems.append(f'access must be "binary" or "indices", got {self.access!r}')
        if self.roles is not None:
            if not self.roles or len(set(self.roles)) != len(self.roles):
                problems.append(f"roles must be distinct and at least one, got {list(self.roles)}")
            problems += [
                f"role {r!r} is not as Workflow.parse reads it back (non-empty, stripped, lower-case)"
                for r in self.roles
                if not r or r != r.strip().lower()
            ]
        if problems:
            raise ConfigError("; ".join(problems))

    def grammar(self) -> str:
        """The grammar in xgrammar's EBNF (GBNF-like), root rule ``root``."""
        lengths = range(0 if self.allow_empty else 1, self.max_steps + 1)
        rules = ["root ::= " + " | ".join(f"wf{n}" for n in lengths)]
        for n in lengths:
            parts = [f'{json.dumps(f"{REASONING_FIELD} = ")} reasoning "\\n"'] if self.reasoning else []
            workers = ["worker"] * n
            if self.conductor_step and n > 1:
                workers[-1] = "last_worker"
            parts.append(_list(MODEL_ID_FIELD, workers, first=True))
            parts.append(_list(SUBTASKS_FIELD, ["subtask"] * n))
            access = ["access"] * n if self.access == "binary" else [f"access{i}" for i in range(n)]
            parts.append(_list(ACCESS_LIST_FIELD, access))
            if self.roles is not None and n:
                parts.append(_list(ROLES_FIELD, ["role"] * n))
            rules.append(f"wf{n} ::= " + " ".join(parts))
        # Sorted: the text a worker is written as doesn't depend on its place, so each order of a pool (GRPO's random
        # pools) shares one grammar, compiled once.
        rules.append("worker ::= " + " | ".join(sorted(self._worker_literal(w) for w in range(self.n_workers))))
        if self.conductor_step and self.max_steps > 1:
            rules.append(f"last_worker ::= worker | {self._worker_literal(self.n_workers)}")
        if self.roles is not None:
            literals = (json.dumps(json.dumps(r, ensure_ascii=False), ensure_ascii=False) for r in self.roles)
            rules.append("role ::= " + " | ".join(literals))
        rules += _access_rules(self.max_steps if self.access == "indices" else None)
        rules.append(_string_rule("subtask", self.max_subtask_bytes))
        longest = self.max_subtask_bytes
        if self.reasoning:
            rules.append(_string_rule("reasoning", self.max_reasoning_bytes))
            longest = max(longest, self.max_reasoning_bytes)
        rules += [f"char{w} ::= {_char_class(w, blank=True)}" for w in _RANGES]
        rules += [f"lead{w} ::= {_char_class(w, blank=False)}" for w in _RANGES]
        rules.append('tail0 ::= ""')
        for k in range(1, longest):
            rules.append(f"tail{k} ::= " + " | ".join(['""', *(f"char{w} tail{k - w}" for w in _RANGES if w <= k)]))
        return "\n".join(rules)

    def names(self) -> tuple[str, ...] | None:
        """What ``Workflow.to_text`` needs to write this format's workers: ``worker_names``, and the conductor's own
        name when a step may name it; ``None`` for numbers."""
        if self.worker_names is None:
            return None
        return (*self.worker_names, SELF_NAME) if self.conductor_step else self.worker_names

    def _worker_literal(self, worker: int) -> str:
        """The EBNF literal of worker ``worker`` as the workflow writes it: its number or its name (a JSON string)."""
        names = self.names()
        text = str(worker) if names is None else json.dumps(names[worker], ensure_ascii=False)
        return json.dumps(text, ensure_ascii=False)

    def longest(self) -> Workflow:
        """A workflow whose text is as long as the grammar allows (in bytes)."""
        role = max(self.roles, key=lambda r: len(json.dumps(r, ensure_ascii=False).encode())) if self.roles else None
        steps = []
        for i in range(self.max_steps):
            access: Access = ACCESS_ALL
            if self.access == "indices" and len(json.dumps(list(range(i)))) > len(json.dumps(ACCESS_ALL)):
                access = tuple(range(i))
            steps.append(Step(self._longest_worker(range(self.n_workers)), "x" * self.max_subtask_bytes, access, role))
        if self.conductor_step and self.max_steps > 1:  # the last step may be the conductor's
            steps[-1] = replace(steps[-1], worker=self._longest_worker(range(self.n_workers + 1)))
        return Workflow(tuple(steps), "x" * self.max_reasoning_bytes if self.reasoning else "")

    def _longest_worker(self, workers: range) -> int:
        return max(workers, key=lambda w: len(self._worker_literal(w).encode()))

    def max_tokens(self) -> int:
        """The most tokens a completion in this format can take, end-of-sequence included (a token is at least
        one byte). Use it as ``max_new_tokens`` so that no sample is cut before the grammar completes."""
        return len(self.longest().to_text(self.names()).encode()) + 1

    def fit(self, max_new_tokens: int) -> WorkflowFormat:
        """This format with the largest ``max_subtask_bytes`` whose ``max_tokens()`` fits ``max_new_tokens``."""
        shortest = replace(self, max_subtask_bytes=1).max_tokens()
        if shortest > max_new_tokens:
            raise ConfigError(
                f"max_new_tokens={max_new_tokens} is too small for workflows of {self.max_steps} steps: even "
                f"one-byte subtasks need {shortest} tokens"
            )
        return replace(self, max_subtask_bytes=1 + (max_new_tokens - shortest) // self.max_steps)


def _list(name: str, items: list[str], *, first: bool = False) -> str:
    """The EBNF of one line ``name = [item, item, ...]``, after a newline unless it is the ``first``."""
    head = json.dumps(("" if first else "\n") + f"{name} = [")
    return " ".join([head, *([' ", " '.join(items)] if items else []), '"]"'])


def _access_rules(max_steps: int | None) -> list[str]:
    """``access`` (binary mode, ``max_steps`` None) or ``access{i}`` per step: also increasing lists of indices
    below ``i``, where ``after{i}_{j}`` continues a list whose last index is ``j``."""
    both = f'{json.dumps(json.dumps(ACCESS_ALL))} | "[]"'
    if max_steps is None:
        return [f"access ::= {both}"]
    rules = []
    for i in range(max_steps):
        rules.append(f"access{i} ::= " + " | ".join([both, *(f'"[{j}" after{i}_{j} "]"' for j in range(i))]))
        rules += [
            f"after{i}_{j} ::= " + " | ".join(['""', *(f'", {k}" after{i}_{k}' for k in range(j + 1, i))])
            for j in range(i)
        ]
    return rules


def _string_rule(name: str, max_bytes: int) -> str:
    """``name``: a JSON string of 1 to ``max_bytes`` bytes whose first character is not whitespace."""
    body = " | ".join(f"lead{w} tail{max_bytes - w}" for w in _RANGES if w <= max_bytes)
    return f'{name} ::= "\\"" ({body}) "\\""'


def workflow_grammar(
    n_workers: int,
    max_steps: int,
    *,
    roles: list[str] | None = None,
    access: Literal["binary", "indices"] = "binary",
    reasoning: bool = False,
    max_subtask_bytes: int = 200,
    max_reasoning_bytes: int = 400,
    conductor_step: bool = False,
    allow_empty: bool = False,
) -> str:
    """The xgrammar EBNF of ``WorkflowFormat(...)`` (see there)."""
    return WorkflowFormat(
        n_workers,
        max_steps,
        roles=tuple(roles) if roles is not None else None,
        access=access,
        reasoning=reasoning,
        max_subtask_bytes=max_subtask_bytes,
        max_reasoning_bytes=max_reasoning_bytes,
        conductor_step=conductor_step,
        allow_empty=allow_empty,
    ).grammar()


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as exc:
        raise MissingDependency(f"constrained decoding needs xgrammar: {INSTALL_HINT}") from exc
    return xgrammar


_compilers: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()
_compiled: weakref.WeakKeyDictionary[Any, dict[tuple[int, str], Any]] = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def compile_grammar(tokenizer: Any, grammar: str, vocab_size: int | None = None) -> Any:
    """An xgrammar ``CompiledGrammar`` of ``grammar`` for ``tokenizer``, cached per tokenizer, vocabulary size and
    grammar: compiling takes seconds, and a fresh ``WorkflowConstraint`` per ``generate`` call should not."""
    xgr = _xgrammar()
    vocab_size = vocab_size or len(tokenizer)
    with _cache_lock:
        compiled = _compiled.setdefault(tokenizer, {})
        if (vocab_size, grammar) not in compiled:
            compilers = _compilers.setdefault(tokenizer, {})
            if vocab_size not in compilers:
                info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
                compilers[vocab_size] = xgr.GrammarCompiler(info, cache_enabled=False)
            started = time.perf_counter()
            compiled[vocab_size, grammar] = compilers[vocab_size].compile_grammar(grammar)
            logger.info(
                "compiled a grammar of %d rules in %.2f s", grammar.count("\n") + 1, time.perf_counter() - started
            )
        return compiled[vocab_size, grammar]


class WorkflowConstraint(LogitsProcessor):
    """A ``LogitsProcessor`` that allows only tokens keeping each row inside ``format``'s grammar, then only
    end-of-sequence.

    For ``model.generate(..., do_sample=True, logits_processor=LogitsProcessorList([constraint]))`` with any batch
    size, ``num_return_sequences`` and left padding: each row has its own matcher. It must come before temperature
    and top-p warpers. One object can serve many ``generate`` calls, one at a time: a call whose input does not
    extend the previous one by exactly one token starts fresh matchers. Beam search is not supported (it reorders
    rows).

    ``stop_token_ids`` must be among ``generate``'s ``eos_token_id`` (default: the tokenizer's end-of-sequence);
    ``vocab_size`` is the model's (default ``len(tokenizer)``; logits beyond it are masked). A row whose token the
    grammar refuses, which happens only when generation ended the row otherwise (a stop string), is left alone.
    """

    def __init__(
        self,
        tokenizer: Any,
        format: WorkflowFormat,
        *,
        stop_token_ids: list[int] | None = None,
        vocab_size: int | None = None,
    ):
        self.format = format
        self.grammar = format.grammar()
        self.vocab_size = vocab_size or len(tokenizer)
        self.compiled = compile_grammar(tokenizer, self.grammar, self.vocab_size)
        self.stop_token_ids = stop_token_ids
        self._matchers: list[Any] = []
        self._live: list[int] = []
        self._previous: torch.Tensor | None = None
        self._bitmask: torch.Tensor | None = None
        self._batch = _xgrammar().BatchGrammarMatcher()

    def matcher(self) -> Any:
        """A fresh xgrammar ``GrammarMatcher`` for this grammar."""
        return _xgrammar().GrammarMatcher(self.compiled, override_stop_tokens=self.stop_token_ids)

    def accepts(self, text: str) -> bool:
        """Whether ``text`` is a complete workflow in this grammar."""
        matcher = self.matcher()
        return matcher.accept_string(text) and matcher.is_completed()

    def _continues(self, input_ids: torch.Tensor) -> bool:
        previous = self._previous
        return (
            previous is not None
            and input_ids.shape[0] == previous.shape[0]
            and input_ids.shape[1] == previous.shape[1] + 1
            and torch.equal(input_ids[:, :-1], previous)
        )

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        xgr = _xgrammar()
        if self._continues(input_ids):
            live = [self._matchers[row] for row in self._live]
            tokens = input_ids[self._live, -1].tolist()
            for row, token, accepted in zip(
                self._live, tokens, self._batch.batch_accept_token(live, tokens), strict=True
            ):
                if not accepted:
                    logger.debug("row %d left the workflow grammar with token %d: unconstrained now", row, token)
                    self._matchers[row] = None
        else:
            self._matchers = [self.matcher() for _ in range(input_ids.shape[0])]
            self._bitmask = xgr.allocate_token_bitmask(input_ids.shape[0], self.vocab_size)
        self._previous = input_ids
        self._live = [i for i, m in enumerate(self._matchers) if m is not None and not m.is_terminated()]
        if self._live:
            live = [self._matchers[row] for row in self._live]
            self._batch.batch_fill_next_token_bitmask(live, self._bitmask, indices=self._live)
            bitmask = self._bitmask.to(scores.device)
            xgr.apply_token_bitmask_inplace(scores, bitmask, vocab_size=self.vocab_size, indices=self._live)
            if scores.shape[-1] > self.vocab_size:
                scores[self._live, self.vocab_size :] = float("-inf")
        return scores


def round_format(conductor: Any, depth: int = 0) -> WorkflowFormat:
    """What ``conductor`` (a ``Conductor``) may write in round ``depth`` (0: the first): its pool and step limit, its
    own id while a recursive round is left, and the empty lists that keep the answer in a recursive round."""
    return WorkflowFormat(
        len(conductor.pool),
        conductor.limits.max_steps,
        conductor_step=depth < conductor.max_depth,
        allow_empty=depth > 0,
        worker_names=tuple(conductor.pool.names) if conductor.worker_ids == "names" else None,
    )


def constrain_for(
    policy: Any,
    n_workers: int,
    max_steps: int,
    max_new_tokens: int,
    *,
    conductor_step: bool = False,
    allow_empty: bool = False,
) -> WorkflowConstraint:
    """The constraint for a pool of ``n_workers`` and ``max_steps`` (and ``WorkflowFormat``'s ``conductor_step`` and
    ``allow_empty``), with strings sized so that any valid workflow fits in ``max_new_tokens`` of ``policy`` (a
    ``ConductorLM``)."""
    form = WorkflowFormat(n_workers, max_steps, conductor_step=conductor_step, allow_empty=allow_empty)
    return _constraint(policy, form, max_new_tokens)


def _constraint(policy: Any, form: WorkflowFormat, max_new_tokens: int) -> WorkflowConstraint:
    """``form``'s constraint for ``policy``, its strings sized to ``max_new_tokens``."""
    return WorkflowConstraint(
        policy.tokenizer,
        form.fit(max_new_tokens),
        stop_token_ids=sorted(policy.eos_ids),
        vocab_size=policy.model.config.vocab_size,
    )


def constrain_program(program: Any) -> None:
    """Give ``program``'s conductor LM (a ``ConductorLM.as_dspy_lm()``) the workflow grammar of the program's pool
    and limits, with strings sized to the LM's ``max_tokens``: the LM is built again from its policy, with the same
    options and the grammar as its logits processor.

    A recursive program (``max_depth > 0``) gets one LM per predictor: ``orchestrate``'s grammar (the first round)
    has the conductor's own id, ``revise``'s (the recursive rounds) also the empty lists, and the conductor's id only
    when a second recursive round may follow (``max_depth > 1``); there, the last round's validation refuses the id.
    """
    lm = program.orchestrate.lm
    policy = trainable_policy(lm)
    if policy is None:
        raise ConfigError("only a local or trained conductor (ConductorLM.as_dspy_lm) decodes under the grammar")
    grammar = constraint_factory(policy, lm.kwargs["max_tokens"])
    options = {**lm.kwargs, "cache": lm.cache, "num_retries": lm.num_retries}

    def constrained(depth: int) -> Any:
        return policy.as_dspy_lm(logits_processor=grammar(program, depth), on_sample=lm.engine.on_sample, **options)

    program.orchestrate.lm = constrained(0)
    if program.max_depth:
        program.revise.lm = constrained(1)


def constraint_factory(policy: Any, max_new_tokens: int) -> Any:
    """What ``GRPOTrainer`` and ``ConductorCompiler`` take as ``logits_processor``: ``(conductor, round)`` -> the
    constraint of that round (``round_format``)."""
    return lambda conductor, depth=0: _constraint(policy, round_format(conductor, depth), max_new_tokens)
