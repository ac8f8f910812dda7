"""Program search: score the candidate workflows on the training questions and find each question's best.

Scoring shares samples: the pool is wrapped in ``ReplayWorker``s, so every candidate that sends a worker the same
prompt (a single worker and every pair that opens with its step) gets the same completion, and each distinct prompt
is paid for once. Candidates are dropped by successive halving: all of them answer a first rung of questions, then
each rung keeps the best ``1/eta`` by mean score, and the rung after scores the survivors on ``eta`` times as many
questions. Hand-written: Optuna's pruners judge a trial by one running value, but here a candidate that is right only
on a minority kind of question (low mean, the only right one there) must survive, so the rule also keeps every
question's own winner, which no pruner expresses.

The budget is in worker calls actually made (replayed answers are free): a question is started only if its
candidates' steps, all called anew, would still fit beside those of the questions running, so the search never spends
past it. Questions run one at a time in this process, or one per CPU on a Ray cluster (``_scoring``).

Each scored (question, candidate) pair is appended to ``scores.jsonl`` in the output folder as its question
finishes, under a key made from the whole example (inputs and labels): a search run again with the same folder and
settings skips every pair it holds, wherever the question now sits in the data, and with the same data makes the same
decisions. A question added, removed or relabelled costs only its own pairs. The workers' completions are kept in that
folder too (``replay.sqlite``, unless the pool's replay workers keep theirs in a store of their own), so pairs scored
in different sittings (a candidate added to a resumed search, a question cut short by a kill) still share their
steps' samples, and none is paid twice.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import dspy
import pydantic
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from conductor.errors import ConfigError
from conductor.modules import Conductor, ReplayStore
from conductor.optimizers._rewards import Metric
from conductor.optimizers.finetune import TemplateStep, WarmStartConfig, template_choices
from conductor.optimizers.search._neighbours import nearest
from conductor.optimizers.search._propose import proposed_subtasks
from conductor.optimizers.search._scoring import Outcome, QuestionScorer, RayQuestionScorer, Scored, question_scorer
from conductor.optimizers.search._space import DIRECT, Candidate, candidate_space

logger = logging.getLogger(__name__)

SCORES = "scores.jsonl"
STATE = "search.json"
SAMPLES = "replay.sqlite"


class ProgramSearchConfig(pydantic.BaseModel):
    """What the search tries, how fast it drops candidates, what it may spend, and how the warm start teaches what
    it found."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    subtasks: tuple[str, ...] = pydantic.Field(
        (DIRECT,), min_length=1, description="first-step instructions tried on every worker (the first opens pairs)"
    )
    propose: bool = pydantic.Field(
        True, description="also try on the models first-step instructions drawn from the training answers' form"
    )
    samples: int = pydantic.Field(3, ge=0, description="answers of one model a combiner sees; below 2: no such shapes")
    pairs: bool = pydantic.Field(True, description="try every worker followed by every worker that checks it")
    plain: bool = pydantic.Field(
        True, description="also try each model, alone and opening pairs, asked the question alone as a user would"
    )
    templates: dict[str, tuple[tuple[TemplateStep, ...], ...]] = pydantic.Field(
        {}, description="optional hand-written workflows (name -> steps, by worker name) scored beside the space"
    )
    first_rung: int = pydantic.Field(8, ge=1, description="questions every candidate answers before any is dropped")
    eta: int = pydantic.Field(3, ge=2, description="each rung keeps 1/eta of the candidates on eta times the questions")
    max_worker_calls: int | None = pydantic.Field(None, ge=1, description="the most worker calls the search makes")
    max_parallel: int = pydantic.Field(8, ge=1, description="candidates run at once on a question")
    label: str | None = pydantic.Field(
        None, description="an example field that names its kind (a task family) for the oracle table; None: groups"
    )
    seed: int = pydantic.Field(0, description="the seed that shuffles the questions before the first rung")
    pools_per_question: int = pydantic.Field(4, ge=1, description="random pools (warm-start examples) a question")
    min_pool_size: int = pydantic.Field(1, ge=1, description="the fewest workers a random pool holds")
    neighbours: int = pydantic.Field(
        10, ge=1, description="questions whose scores pick what each is taught: itself and the most alike by words"
    )
    training: WarmStartConfig = pydantic.Field(
        WarmStartConfig(steps=40), description="the fine-tune that teaches the conductor what the search found"
    )

    @pydantic.field_validator("templates", mode="before")
    @classmethod
    def _template_steps(cls, value: Any) -> Any:
        return {name: template_choices(steps) for name, steps in value.items()} if isinstance(value, dict) else value


@dataclass
class SearchCost:
    """What the search itself spent: worker calls made (replayed answers excluded), their tokens, and wall time."""

    worker_calls: int = 0
    tokens: int = 0
    wall_s: float = 0.0


@dataclass
class SearchResult:
    """The scored candidates: ``outcomes[i][name]`` is candidate ``name`` on ``examples[i]`` (absent where it was
    dropped before that question, or the budget ran out)."""

    candidates: list[Candidate]
    examples: list[dspy.Example]
    outcomes: list[dict[str, Outcome]]
    cost: SearchCost
    rungs: list[dict[str, int]] = field(default_factory=list)
    exhausted: bool = False
    """Whether the worker-call budget stopped the search before every survivor answered every question."""
    neighbours: int = 1
    """How many questions (itself included, the rest the most alike by words) pick what a question is taught."""

    def mean(self, candidate: Candidate) -> tuple[float, int]:
        """The candidate's mean score over the questions it answered, and how many those were."""
        scores = [row[candidate.name].score for row in self.outcomes if candidate.name in row]
        return (sum(scores) / len(scores) if scores else 0.0, len(scores))

    def mean_price(self, candidate: Candidate) -> tuple[float, float, float]:
        prices = [row[candidate.name].price for row in self.outcomes if candidate.name in row]
        return tuple(sum(p[i] for p in prices) / max(len(prices), 1) for i in range(3))  # type: ignore[return-value]

    def overall(self) -> list[Candidate]:
        """Every candidate, best first: the survivors of later rungs (more questions answered) before those dropped
        earlier, then by mean score, then the cheaper. Means over different questions are not compared."""
        return list(self._overall)

    @functools.cached_property
    def _overall(self) -> tuple[Candidate, ...]:  # the outcomes are complete once a result is made
        return tuple(sorted(self.candidates, key=lambda c: (-self.mean(c)[1], -self.mean(c)[0], self.mean_price(c))))

    def preferences(self, index: int) -> list[Candidate]:
        """The candidates for question ``index`` in the order the warm start prefers them. First those right about as
        often as the best on the questions like it (its neighbourhood: itself and its ``neighbours - 1`` nearest by
        words, ``nearest``, each weighted by how alike it is; a candidate dropped before it was scored on all of them
        counts 0 there), within one standard error of the best rate, the cheaper first (dollars, then calls), then
        ``overall``'s order (tokens its last word); then the rest, the one right most often near it first, then one
        right on this question, then the cheaper; those not scored on it last. A question whose neighbourhood no
        candidate answers gets ``overall``'s order: where a single strong worker would send it.

        Why the neighbourhood before the question's own score: one sample per question makes its winners partly
        luck, and what the conductor is taught is a guess about questions it has not seen. On issue 25's navigate,
        where every candidate is near chance, each question's own winner taught one kind several workflows, and with
        fallbacks the conductor learned none of them. How often a candidate is right on the questions like this one
        is the better estimate of how it does here; ``neighbours=1`` makes it the question's own score. A question
        worded unlike its neighbours keeps its own winner: a kind of one question is still taught its workflow.

        Why rates within one standard error count as a tie (the one-standard-error rule of model selection): on a
        kind near chance several candidates are right about as often, and which one leads changes from question to
        question with the weights of its neighbours; taught by that, issue 25's navigate got three workflows and the
        conductor wrote a blend of them that answered nothing (run 7). Among candidates the data can't tell apart the
        cheaper and then the better overall is taught, the same one for every question of the kind. A rate of 1 has
        no error: a candidate always right near the question is never tied with one that is not."""
        row, rate = self.outcomes[index], self._neighbourhood_rate(index)
        if not any(rate.values()) and not any(o.score > 0 for o in row.values()):
            return list(self._overall)
        rank = {c.name: i for i, c in enumerate(self._overall)}
        best = max(rate.values(), default=0.0)
        tied = best - math.sqrt(best * (1 - best) / self._effective_size(index))

        def preference(candidate: Candidate) -> tuple:
            name, price = candidate.name, _price(row, candidate)[:2]
            if name in rate and rate[name] > 0 and rate[name] >= tied:
                return (False, 0, 0.0, 0.0, *price)  # about as good as the best: the cheaper first
            own = row[name].score if name in row else 0.0
            return (name not in row, 1, -rate.get(name, 0.0), -own, *price)

        return sorted(self.candidates, key=lambda c: (*preference(c), rank[c.name]))

    def prospects(self, index: int) -> list[Candidate]:
        """``preferences`` cut to the candidates with a chance on question ``index``: right on it or on a question
        like it. What the warm start teaches: a random pool that can run none of them is drawn again, since a
        workflow never right on questions like this one would teach its kind a guess with nothing behind it. When
        nothing is right near it, all of ``preferences`` (``overall``'s order)."""
        chance = {name for name, outcome in self.outcomes[index].items() if outcome.score > 0}
        chance |= {name for name, rate in self._neighbourhood_rate(index).items() if rate > 0}
        ranked = self.preferences(index)
        return [c for c in ranked if c.name in chance] or ranked

    def _neighbourhood_rate(self, index: int) -> dict[str, float]:
        """Each candidate's mean score over question ``index``'s neighbourhood (those of its questions scored at all),
        each question weighted by its similarity to ``index`` (``index`` itself by 1), for the candidates scored on
        every one of them. A question unlike its neighbours so keeps its own winner."""
        hood = [(self.outcomes[j], weight) for j, weight in self._neighbourhoods[index] if self.outcomes[j]]
        total = sum(weight for _, weight in hood)
        return {
            name: sum(outcomes[name].score * weight for outcomes, weight in hood) / total
            for name in self.outcomes[index]
            if all(name in outcomes for outcomes, _ in hood)
        }

    def _effective_size(self, index: int) -> float:
        """How many equally weighted questions question ``index``'s weighted neighbourhood is worth (Kish's effective
        sample size: the squared sum of the weights over the sum of their squares)."""
        weights = [weight for j, weight in self._neighbourhoods[index] if self.outcomes[j]]
        return sum(weights) ** 2 / sum(w * w for w in weights)

    @functools.cached_property
    def _neighbourhoods(self) -> list[tuple[tuple[int, float], ...]]:
        texts = [" ".join(str(value) for value in example.inputs().values()) for example in self.examples]
        return nearest(texts, self.neighbours)

    def winner(self, index: int) -> Candidate | None:
        """What question ``index`` is taught (``preferences``' first), or ``None`` when no candidate answered it."""
        row = self.outcomes[index]
        if not any(o.score > 0 for o in row.values()):
            return None
        return self.preferences(index)[0]


def _price(row: dict[str, Outcome], candidate: Candidate) -> tuple[float, int, int]:
    return row[candidate.name].price if candidate.name in row else (math.inf, 0, 0)


def program_search(
    program: Conductor,
    trainset: Sequence[dspy.Example],
    metric: Metric,
    config: ProgramSearchConfig | None = None,
    *,
    output_dir: str | Path | None = None,
    progress: bool = False,
    ray: str | None = None,
) -> SearchResult:
    """Score ``program``'s candidate workflows (``candidate_space`` over its pool, plus ``config``'s
    templates) on ``trainset`` with ``metric``, by successive halving within ``max_worker_calls``; with
    ``output_dir``, resumable and reported there (``write_search_report``); with ``ray`` (a cluster address), one
    question per CPU of that cluster at once (``RayQuestionScorer``). Raises ``ConfigError`` for a pool or dataset the
    search can't use."""
    config = config or ProgramSearchConfig()
    examples = _usable(program, trainset)
    proposed = proposed_subtasks(examples, program.signature.output_fields) if config.propose else []
    if proposed:
        logger.info("program search: instructions proposed for the models %s", proposed)
    candidates = _space(program, config, proposed)
    _warn_unwritable(program, candidates)
    order = list(range(len(examples)))
    random.Random(config.seed).shuffle(order)  # a rung of mixed questions, not the file's first kind
    folder = Path(output_dir) if output_dir is not None else None
    store = _ScoreStore(folder, candidates, examples)
    scorer = question_scorer(program, _samples(program, folder), metric, config.max_parallel, ray)
    alive, rungs = list(candidates), []
    size, exhausted = min(config.first_rung, len(order)), False
    try:
        with _progress(progress) as bar:
            while True:
                bar(f"rung {len(rungs) + 1}: {len(alive)} candidates on {size} questions", len(alive) * size)
                exhausted = _score_rung(scorer, examples, order[:size], alive, store, config.max_worker_calls, bar)
                rungs.append({"candidates": len(alive), "questions": size})
                if exhausted or size == len(order):
                    break
                alive = _survivors(alive, [store.outcomes(i) for i in order[:size]], config.eta)
                size = min(len(order), size * config.eta)
    finally:
        scorer.close()
    spent = store.spent()
    store.save_cost()
    outcomes = [store.outcomes(i) for i in range(len(examples))]
    result = SearchResult(candidates, examples, outcomes, spent, rungs, exhausted, config.neighbours)
    logger.info(
        "program search: %d candidates, %d worker calls, %d tokens, %.1f s%s",
        len(candidates),
        spent.worker_calls,
        spent.tokens,
        spent.wall_s,
        " (budget exhausted)" if exhausted else "",
    )
    return result


def _samples(program: Conductor, folder: Path | None) -> ReplayStore | None:
    """Where the search keeps its workers' completions beyond one process: the store the pool's replay workers keep
    theirs in (which a config shares with the compile's other phases), else ``replay.sqlite`` in its folder; with
    neither, each process's memory alone."""
    if program.pool.replay_store is not None or folder is None:
        return program.pool.replay_store
    return ReplayStore(folder / SAMPLES)


def _space(program: Conductor, config: ProgramSearchConfig, proposed: Sequence[str]) -> list[Candidate]:
    if not len(program.pool):
        raise ConfigError("program search needs a pool with at least one worker")
    space = candidate_space(
        program.pool,
        subtasks=config.subtasks,
        proposed=proposed,
        samples=config.samples,
        max_steps=program.limits.max_steps,
        pairs=config.pairs,
        plain=config.plain,
    )
    names = set(program.pool.names)
    for name, alternatives in config.templates.items():
        for i, steps in enumerate(alternatives):
            missing = sorted({s.worker for s in steps} - names)
            if missing:
                raise ConfigError(f"search template {name!r} names workers the pool lacks: {missing}")
            space.append(Candidate(f"{name}" if len(alternatives) == 1 else f"{name} [{i + 1}]", steps))
    return space


def _warn_unwritable(program: Conductor, candidates: Sequence[Candidate]) -> None:
    """Warn about instructions longer than the conductor's workflow grammar lets it write (its LM's logits processor
    sizes each subtask to the LM's ``max_tokens``): the warm start teaches them, but the conductor writes them cut,
    so its steps run other prompts than the ones scored (and a cut direct step is no longer asked plain)."""
    cap = getattr(getattr(program.decoding_constraint, "format", None), "max_subtask_bytes", None)
    if cap is None:  # no grammar: any instruction can be written
        return
    long = sorted({s.subtask for c in candidates for s in c.steps if len(s.subtask.encode()) > cap})
    if long:
        logger.warning(
            "program search: the conductor's grammar lets it write subtasks of at most %d bytes (sized to its "
            "max_tokens), and these instructions of the search are longer, so the conductor will write them cut and "
            "run prompts that were never scored: %s. Raise the conductor's max_tokens, or give `subtasks` (and any "
            "templates) that fit.",
            cap,
            "; ".join(repr(text) for text in long),
        )


def _usable(program: Conductor, trainset: Sequence[dspy.Example]) -> list[dspy.Example]:
    """The training examples, after checking each has the program's inputs (one error listing every bad one)."""
    if not trainset:
        raise ConfigError("program search needs at least one training question; got none")
    problems = []
    for i, example in enumerate(trainset):
        try:
            inputs = example.inputs()
        except ValueError:
            problems.append(f"example {i} has no input fields: build it with .with_inputs(...)")
            continue
        question = program.question_text(dict(inputs))
        if not isinstance(question, str):
            problems.append(f"example {i}: {question.message}")
    if problems:
        raise ConfigError("unusable training questions for program search:\n" + "\n".join(f"  {p}" for p in problems))
    return list(trainset)


def _score_rung(
    scorer: QuestionScorer | RayQuestionScorer,
    examples: Sequence[dspy.Example],
    questions: Sequence[int],
    alive: Sequence[Candidate],
    store: _ScoreStore,
    budget: int | None,
    bar: Callable[[str | None, int], None],
) -> bool:
    """Score every candidate of ``alive`` not yet scored on ``questions``, ``scorer.slots`` questions at once, and
    record each question as it finishes. A question starts only if its steps, all called anew, fit ``budget`` beside
    what the search has spent and what the questions running could still spend. Returns whether the budget ran out."""
    running: dict[int, tuple[list[Candidate], int]] = {}  # question -> its candidates, and the most calls they make
    waiting, exhausted = iter(questions), False
    while True:
        while not exhausted and len(running) < scorer.slots and (i := next(waiting, None)) is not None:
            todo = [c for c in alive if c.name not in store.outcomes(i)]
            if not todo:  # scored in an earlier sitting
                bar(None, len(alive))
                continue
            most = sum(len(c.steps) for c in todo)
            exhausted = (
                budget is not None and store.spent().worker_calls + sum(m for _, m in running.values()) + most > budget
            )
            if not exhausted:
                scorer.submit(i, examples[i], todo)
                running[i] = (todo, most)
        if not running:
            return exhausted
        scored = scorer.next()
        store.record(scored, running.pop(scored.index)[0])
        bar(None, len(alive))


def _survivors(alive: Sequence[Candidate], rows: Sequence[dict[str, Outcome]], eta: int) -> list[Candidate]:
    """The best ``ceil(len(alive) / eta)`` by mean score over ``rows`` (the cheaper of equals first), and every
    question's own winner: the cheapest of those that scored best on it, when any scored."""

    def mean(c: Candidate) -> float:
        return sum(row[c.name].score for row in rows) / len(rows)

    def price(c: Candidate) -> tuple[float, ...]:
        return tuple(sum(row[c.name].price[i] for row in rows) for i in range(3))

    ranked = sorted(alive, key=lambda c: (-mean(c), price(c)))
    keep = {c.name for c in ranked[: math.ceil(len(alive) / eta)]}
    for row in rows:
        best = max(row[c.name].score for c in alive)
        if best > 0:
            keep.add(min((c for c in alive if row[c.name].score == best), key=lambda c: row[c.name].price).name)
    return [c for c in alive if c.name in keep]


class _ScoreStore:
    """Outcomes in memory, and appended to ``scores.jsonl`` as they come when there is a folder; cost and the
    candidates' steps in ``search.json``. A line whose candidate is no longer in the space, or whose question is not
    in the data, is ignored."""

    def __init__(self, folder: Path | None, candidates: Sequence[Candidate], examples: Sequence[dspy.Example]):
        self.folder = folder
        self._keys = [question_key(e) for e in examples]
        self._rows: dict[int, dict[str, Outcome]] = {}
        self.before = SearchCost()  # what earlier sittings spent
        self._calls = self._tokens = 0
        self._started = time.perf_counter()
        if folder is None:
            return
        folder.mkdir(parents=True, exist_ok=True)
        known = {c.name: c for c in candidates}
        index = {key: i for i, key in enumerate(self._keys)}
        lines = (folder / SCORES).read_text().splitlines() if (folder / SCORES).exists() else []
        readable, unkeyed = [], 0
        for n, line in enumerate(lines):
            try:
                record = json.loads(line)
                if "key" not in record:  # written before questions had keys: kept in the file, scored again
                    unkeyed += 1
                    readable.append(line)
                    continue
                candidate, i = known.get(record["candidate"]), index.get(record["key"])
                if candidate is not None and i is not None and _steps(candidate) == record["steps"]:
                    self._rows.setdefault(i, {})[record["candidate"]] = Outcome(**record["outcome"])
                readable.append(line)
            except (json.JSONDecodeError, KeyError, TypeError) as exc:  # a line cut short by a kill: score it again
                logger.warning("%s line %d unreadable (%s): that pair is scored again", folder / SCORES, n + 1, exc)
        if unkeyed:
            logger.warning(
                "%s: %d pairs carry no question key (an older version wrote them): scored again",
                folder / SCORES,
                unkeyed,
            )
        if len(readable) < len(lines):  # else the next record would be appended to the cut line, and lost with it
            (folder / SCORES).write_text("".join(line + "\n" for line in readable))
        if (folder / STATE).exists():
            saved = json.loads((folder / STATE).read_text())
            self.before = SearchCost(**{name: saved[name] for name in ("worker_calls", "tokens", "wall_s")})
        if self._rows:
            logger.info("program search: resuming with %d scored pairs", sum(map(len, self._rows.values())))

    def outcomes(self, index: int) -> dict[str, Outcome]:
        return self._rows.setdefault(index, {})

    def record(self, scored: Scored, candidates: Sequence[Candidate]) -> None:
        """Keep a question's outcomes (in ``candidates``' order) and what they cost; a killed search
        resumes with the cost so far."""
        for candidate, outcome in zip(candidates, scored.outcomes, strict=True):
            self._add(scored.index, candidate, outcome)
        self._calls += scored.calls
        self._tokens += scored.tokens
        self.save_cost()

    def _add(self, index: int, candidate: Candidate, outcome: Outcome) -> None:
        self.outcomes(index)[candidate.name] = outcome
        if self.folder is not None:
            record = {"question": index, "key": self._keys[index], "candidate": candidate.name}
            with open(self.folder / SCORES, "a") as f:
                f.write(json.dumps({**record, "steps": _steps(candidate), "outcome": asdict(outcome)}) + "\n")

    def spent(self) -> SearchCost:
        """What the search has spent in all: earlier sittings' cost plus this one's calls, tokens and time."""
        return SearchCost(
            self.before.worker_calls + self._calls,
            self.before.tokens + self._tokens,
            self.before.wall_s + time.perf_counter() - self._started,
        )

    def save_cost(self) -> None:
        if self.folder is not None:
            (self.folder / STATE).write_text(json.dumps(asdict(self.spent()), indent=2))


def question_key(example: dspy.Example) -> str:
    """A short digest of the whole example (inputs and labels, so a relabelled question is scored anew)."""
    text = json.dumps(example.toDict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _steps(candidate: Candidate) -> list[dict[str, Any]]:
    return [step.model_dump(mode="json") for step in candidate.steps]


@contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[str | None, int], None]]:
    """A rich bar with an ETA on stderr; yields ``update(description, n)``: a new rung of ``n`` runs when
    ``description`` is given, else ``n`` more runs done."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, TimeRemainingColumn(), console=Console(stderr=True), disable=not enabled) as shown:
        task = shown.add_task("program search", total=None)

        def update(description: str | None, n: int) -> None:
            if description is None:
                shown.update(task, advance=n)
            else:
                shown.update(task, description=description, total=n, completed=0)

        yield update
