"""``ConductorCompiler``: the user's main verb. It alternates prompt/program search with GRPO on the conductor's
weights (after an optional expert-iteration warm start), then lets Optuna set budgets, evaluating on the validation
set after every phase and keeping the best.

Read it as a recipe: ``compile`` = evaluate the student, then for each phase: run it from the best program so far,
evaluate, keep the result only if it scores higher, checkpoint. Checkpoints are deployable folders
(``conductor.save``) plus ``compiler_state.json``; a run that stops is resumed by calling ``compile`` again with
the same ``output_dir``: finished phases are not run again, and a warm start or GRPO phase goes on from its last
checkpoint (``warm_start/<phase>/checkpoints/``, ``grpo-<round>/checkpoints/``).

Every phase's program is saved too, kept or not (``phases/<n>-<phase>/``), with each validation question's score, so
that each phase is compared with the program it started from question by question (``paired.md``), on validation
as it runs and on another split afterwards (``score_phases``: the test split, over one pool of shared samples).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import dspy
from dspy.teleprompt import Teleprompter

from conductor._stats import wilson_interval
from conductor.deploy import load_program, save_program
from conductor.errors import ConductorError
from conductor.local import trainable_policy
from conductor.modules import Conductor
from conductor.optimizers._evaluate import evaluate_program
from conductor.optimizers._expert_iteration import ExpertIterationConfig, expert_iteration
from conductor.optimizers._metric import WorkflowMetric
from conductor.optimizers._paired import RIGHT, PairedComparison, paired_comparison, paired_table
from conductor.optimizers.finetune import (
    TemplateWarmStartConfig,
    WarmStartConfig,
    WarmStartReport,
    check_templates,
    templated_workflows,
    warm_start,
)
from conductor.optimizers.search import ProgramSearchConfig, program_search, searched_workflows, write_search_report

logger = logging.getLogger(__name__)

STATE = "compiler_state.json"
BEST = "best"
PHASES = "phases"
PAIRED = "paired"
PARETO = "pareto.png"
ENOUGH_VALIDATION = 60
"""Fewer validation questions than this and a phase's gain is hard to tell from noise (issue 26 asks for 60)."""
Phase = Callable[[Conductor, list[dspy.Example], list[dspy.Example]], tuple[Conductor, str]]
"""A phase: the best program so far (a copy), train and validation sets -> the new program and what it changed."""


@dataclass
class PhaseRecord:
    """One row of the phase table."""

    phase: str
    score: float
    cost_per_question: float
    tokens_per_question: float
    kept: bool
    seconds: float
    change: str


class ConductorCompiler(Teleprompter):
    """Compile a ``Conductor`` against ``metric``.

    Args:
        metric: ``metric(example, prediction, trace=None) -> float | bool``.
        output_dir: checkpoints, the phase table (``phases.md``, ``phases.json``), the best program (``best/``), every
            phase's program (``phases/<n>-<phase>/``), each phase against the program it started from on validation
            (``paired.md``, ``paired.json``; on test too after ``score_phases``) and, with a budget phase, the plot of
            its Pareto front (``pareto.png``).
        prompt_search: a DSPy teleprompter for instructions and few-shot workflows (e.g. ``WorkflowFewShot``,
            ``PromptSearch``); ``None`` skips the prompt phases.
        search: a ``ProgramSearchConfig`` (or its fields as a dict): a first phase that scores candidate workflows
            made from the pool on the training questions (``program_search``; resumable, reported in ``search/``)
            and fine-tunes a trainable conductor on each question's best, over random pools (``searched_workflows``).
        template_warm_start: a ``TemplateWarmStartConfig`` (or its fields as a dict): a first phase that fine-tunes
            a trainable conductor on known-good workflow templates per task family, over random pools
            (``templated_workflows``).
        expert_iteration: an ``ExpertIterationConfig`` (or its fields as a dict): a phase before the first GRPO
            phase that fine-tunes a trainable conductor on the workflows it sampled that scored, for when GRPO alone
            would rarely sample a family's right workflow (``expert_iteration``).
        grpo: a ``GRPOConfig`` (or its fields as a dict); used when the conductor LM is a trainable ``ConductorLM``.
        rounds: how many times prompt search and GRPO alternate.
        budget_tuner: a ``BudgetTuner`` run last, picking a point by ``max_cost`` / ``min_accuracy``.
        logits_processor: a factory per pool and round (e.g. the workflow grammar's): GRPO's, and its first round's for
            expert iteration.
        num_threads: evaluation threads.
        ray: a Ray cluster address ('auto', 'local', 'ray://host:10001'): the program search's questions and the
            validation sets are scored there, one actor or task per CPU (``program_search``, ``evaluate_program``);
            ``None``: in this process. (GRPO's rollouts have their own: ``grpo``'s ``ray``.)
        progress: show a progress bar with an ETA (stderr) for the program search and the warm starts.
        rollout_setup: passed to GRPO: how its rollout actors build policy and program when ``grpo`` has ``ray``.
    """

    def __init__(
        self,
        metric: Callable[..., Any],
        *,
        output_dir: str | Path,
        prompt_search: Teleprompter | None = None,
        search: Any = None,
        template_warm_start: Any = None,
        expert_iteration: Any = None,
        grpo: Any = None,
        rounds: int = 1,
        budget_tuner: Any = None,
        max_cost: float | None = None,
        min_accuracy: float | None = None,
        logits_processor: Any = None,
        num_threads: int = 1,
        ray: str | None = None,
        rollout_setup: Callable[[], Any] | None = None,
        progress: bool = False,
    ):
        super().__init__()
        if rounds < 1:
            raise ConductorError(f"rounds must be at least 1, not {rounds}")
        self.metric = metric
        self.output_dir = Path(output_dir)
        self.prompt_search = prompt_search
        self.search = search
        self.template_warm_start = template_warm_start
        self.expert_iteration = expert_iteration
        self.grpo = grpo
        self.rounds = rounds
        self.budget_tuner = budget_tuner
        self.max_cost, self.min_accuracy = max_cost, min_accuracy
        self.logits_processor = logits_processor
        self.num_threads = num_threads
        self.ray = ray
        self.rollout_setup = rollout_setup
        self.progress = progress

    # ---- the recipe ----------------------------------------------------------------------------------------------
    def compile(self, student: Conductor, *, trainset: list, valset: list | None = None, **_: Any) -> Conductor:
        if not trainset:
            raise ConductorError("compile needs a non-empty trainset")
        valset = valset or trainset
        phases = self._phases(student)
        if not phases:
            raise ConductorError(
                "nothing to compile: give prompt_search, grpo (with a trainable conductor) or budget_tuner"
            )
        warn_if_small(len(valset))
        self.output_dir.mkdir(parents=True, exist_ok=True)
        state = self._load_state()
        if state is None:
            WorkflowMetric(self.metric).check(student, trainset[0])  # a metric that can't score fails here, clearly
            best = student
            record, scores = self._evaluate(
                "start", best, valset, 0, kept=True, seconds=0.0, change="the student as given"
            )
            state = {
                "done": [],
                "records": [asdict(record)],
                "best_score": record.score,
                "validation_scores": {"start": scores},
            }
            self._checkpoint(best, state)
        else:
            best = self._resumed_best(student, state)
        for name, run in phases:
            if name in state["done"]:
                continue
            started = time.perf_counter()
            policy = trainable_policy(best.orchestrate.lm)
            weights = policy.trainable_state() if policy is not None else None
            candidate, change = run(best.deepcopy(), trainset, valset)
            seconds = time.perf_counter() - started
            index = len(state["records"])
            record, scores = self._evaluate(name, candidate, valset, index, kept=False, seconds=seconds, change=change)
            if record.score > state["best_score"]:
                best, record.kept, state["best_score"] = candidate, True, record.score
            elif weights is not None:
                # a copy shares its conductor LM: a phase that trained the policy in place trained best's as well
                policy.restore_trainable_state(weights)
            state["done"].append(name)
            state["records"].append(asdict(record))
            state["validation_scores"][name] = scores
            self._checkpoint(best, state)
        self._write_reports(state)
        return best

    def _phases(self, student: Conductor) -> list[tuple[str, Phase]]:
        policy = trainable_policy(student.orchestrate.lm)
        weight_phases = (self.search, self.template_warm_start, self.expert_iteration, self.grpo)
        if any(phase is not None for phase in weight_phases) and policy is None:
            logger.warning("the conductor LM is not a trainable ConductorLM: its weights are not trained")
        phases: list[tuple[str, Phase]] = []
        if self.search is not None and policy is not None:
            phases.append(("program-search", self._search_phase))
        if self.template_warm_start is not None and policy is not None:
            # before the start is scored: a template on a worker the pool lacks fails at once, losing nothing
            check_templates(student.pool, TemplateWarmStartConfig.model_validate(self.template_warm_start).templates)
            phases.append(("template-warm-start", self._template_phase))
        if self.expert_iteration is not None and policy is not None:
            phases.append(("expert-iteration", self._expert_phase))
        for r in range(1, self.rounds + 1):
            if self.prompt_search is not None:
                phases.append((f"prompt-{r}", self._prompt_phase))
            if self.grpo is not None and policy is not None:
                phases.append((f"grpo-{r}", lambda program, train, val, r=r: self._grpo_phase(program, train, r)))
        if self.budget_tuner is not None:
            phases.append(("budget", self._budget_phase))
        return phases

    # ---- phases --------------------------------------------------------------------------------------------------
    def _prompt_phase(self, program: Conductor, trainset: list, valset: list) -> tuple[Conductor, str]:
        searched = self.prompt_search.compile(program, trainset=trainset, valset=valset)
        demos = len(searched.orchestrate.demos)
        return (
            searched,
            f"conductor and role instructions; {demos} few-shot workflow(s) ({type(self.prompt_search).__name__})",
        )

    def _search_phase(self, program: Conductor, trainset: list, valset: list) -> tuple[Conductor, str]:
        config = ProgramSearchConfig.model_validate(self.search)
        folder = self.output_dir / "search"
        result = program_search(
            program, trainset, self.metric, config, output_dir=folder, progress=self.progress, ray=self.ray
        )
        write_search_report(result, folder, label=config.label)
        examples = searched_workflows(
            program.pool,
            result,
            pools_per_question=config.pools_per_question,
            min_pool_size=config.min_pool_size,
            seed=config.seed,
        )
        report = self._warm_start("program-search", program, examples, config.training)
        kinds = len({w.name for w in map(result.winner, range(len(result.examples))) if w is not None})
        return program, (
            f"the conductor's LoRA weights: a warm start on the search's winners ({len(result.candidates)} candidates, "
            f"{result.cost.worker_calls} worker calls, {kinds} distinct winners; table in search/oracle.md), "
            f"{len(examples)} examples over random pools, {report.summary()}"
        )

    def _template_phase(self, program: Conductor, trainset: list, valset: list) -> tuple[Conductor, str]:
        config = TemplateWarmStartConfig.model_validate(self.template_warm_start)
        examples = templated_workflows(
            program.pool,
            trainset,
            config.templates,
            label=config.label,
            pools_per_question=config.pools_per_question,
            min_pool_size=config.min_pool_size,
            seed=config.seed,
        )
        if not examples:
            return program, f"nothing: no training question's {config.label} has a template"
        report = self._warm_start("template-warm-start", program, examples, config.training)
        return program, (
            f"the conductor's LoRA weights: a warm start on {len(examples)} templated workflows "
            f"({', '.join(config.templates)}; {config.pools_per_question} random pools a question), "
            f"{report.summary()}"
        )

    def _warm_start(self, phase: str, program: Conductor, examples: list, config: WarmStartConfig) -> WarmStartReport:
        """Fine-tunes ``program``'s conductor on ``examples``, checkpointing into ``warm_start/<phase>/`` so that a
        compile killed during it goes on from there, and keeps the curve (``_keep_curve``)."""
        policy = trainable_policy(program.orchestrate.lm)
        folder = self.output_dir / "warm_start" / phase
        report = warm_start(policy, program, examples, config, checkpoint_dir=folder, progress=self.progress)
        self._keep_curve(phase, report)
        return report

    def _keep_curve(self, phase: str, report: WarmStartReport) -> None:
        """The loss of every step of ``phase``'s warm start, in ``warm_start/<phase>.json``: a curve still falling, or
        under one epoch, says the phase wants more steps."""
        folder = self.output_dir / "warm_start"
        folder.mkdir(exist_ok=True)
        (folder / f"{phase}.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")

    def _expert_phase(self, program: Conductor, trainset: list, valset: list) -> tuple[Conductor, str]:
        config = ExpertIterationConfig.model_validate(self.expert_iteration)
        processor = self.logits_processor(program, 0) if self.logits_processor is not None else None
        policy = trainable_policy(program.orchestrate.lm)
        report = expert_iteration(policy, program, trainset, self.metric, config, logits_processor=processor)
        kept = ", ".join(f"{label} {n}" for label, n in report.kept.items())
        if report.warm_start is None:
            return program, f"nothing: no sampled workflow was kept ({config.samples} a question)"
        self._keep_curve("expert-iteration", report.warm_start)
        rule = "and above their family's base rate " if config.keep == "above_base_rate" else ""
        return program, (
            f"the conductor's LoRA weights: expert iteration, {config.samples} workflows sampled a question, "
            f"those that earned {config.min_reward} {rule}kept ({kept}), {report.warm_start.steps} warm-start steps"
        )

    def _grpo_phase(self, program: Conductor, trainset: list, round_: int) -> tuple[Conductor, str]:
        from conductor.optimizers.grpo import GRPOConfig, GRPOTrainer

        fields = self.grpo.model_dump() if hasattr(self.grpo, "model_dump") else dict(self.grpo)
        config = GRPOConfig(**{**fields, "output_dir": self.output_dir / f"grpo-{round_}", "resume": True})
        policy = trainable_policy(program.orchestrate.lm)
        GRPOTrainer(
            config,
            policy,
            program,
            trainset,
            self.metric,
            logits_processor=self.logits_processor,
            rollout_setup=self.rollout_setup,
        ).run()
        # the policy behind the program's conductor LM was trained in place
        return program, f"the conductor's LoRA weights: {config.steps} GRPO steps (curve in grpo-{round_}/)"

    def _budget_phase(self, program: Conductor, trainset: list, valset: list) -> tuple[Conductor, str]:
        tuner = self.budget_tuner
        tuner.optimize(program, valset)
        tuner.plot_front(self.output_dir / PARETO)
        point = tuner.pick(max_cost=self.max_cost, min_accuracy=self.min_accuracy)
        settings = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in point.params.items())
        return tuner.apply(program, point), f"Optuna's pick (trial {point.trial}; front in {PARETO}): {settings}"

    # ---- evaluation, checkpoints, report -------------------------------------------------------------------------
    def _evaluate(
        self, phase: str, program: Conductor, valset: list, index: int, **record: Any
    ) -> tuple[PhaseRecord, list[float]]:
        """Score ``program`` on ``valset`` and save it as the ``index``-th phase's program: its record and each
        question's score."""
        result = evaluate_program(program, valset, self.metric, threads=self.num_threads, ray=self.ray)
        predictions = [prediction for _, prediction, _ in result.results]
        n = max(len(predictions), 1)
        cost = sum(getattr(p, "cost", 0.0) or 0.0 for p in predictions) / n
        tokens = sum(getattr(p, "tokens", 0) or 0 for p in predictions) / n
        logger.info("%s: validation score %.1f, $%.6f and %.0f tokens per question", phase, result.score, cost, tokens)
        # saved before a phase that is not kept has its weights restored: the folder holds what was scored
        save_program(program, self._phase_folder(index, phase))
        scores = [float(score) for *_, score in result.results]
        return PhaseRecord(phase, float(result.score), cost, tokens, **record), scores

    def _phase_folder(self, index: int, phase: str) -> Path:
        return self.output_dir / PHASES / f"{index}-{phase}"

    def _checkpoint(self, best: Conductor, state: dict[str, Any]) -> None:
        compiler = {"phases_done": state["done"], "best_score": state["best_score"]}
        save_program(best, self.output_dir / BEST, extra_manifest={"compiler": compiler})
        tmp = self.output_dir / f".{STATE}.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.output_dir / STATE)  # the state names the best folder only once that folder is complete
        self._write_reports(state)

    def _resumed_best(self, student: Conductor, state: dict[str, Any]) -> Conductor:
        folder = self.output_dir / BEST
        if folder.exists():
            logger.info("resuming: %d phase(s) already done (%s)", len(state["done"]), ", ".join(state["done"]))
            best = load_program(folder, trust_code=True)  # its own checkpoint of the user's program
            # a saved program names no replay store: the phases left score on the student's samples, as the done did
            store = student.pool.replay_store
            return best if store is None else best.replaying_on(store)
        # the state and reports are small enough to commit beside a run's results, its weights often are not (a fresh
        # clone has the one without the other): keep the scored start, and run every phase again from the student
        logger.warning(
            "resuming without %s: phase(s) %s run again from the student as given",
            folder,
            ", ".join(state["done"]) or "(none)",
        )
        start = state["records"][0]
        state.update(
            done=[],
            records=[start],
            best_score=start["score"],
            validation_scores={k: v for k, v in state["validation_scores"].items() if k == "start"},
        )
        return student

    def _load_state(self) -> dict[str, Any] | None:
        path = self.output_dir / STATE
        if not path.exists():
            return None
        try:
            state = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ConductorError(f"{path} is damaged ({exc}); remove it to start the compile over") from exc
        state.setdefault("validation_scores", {})  # a compile from before they were kept: its phases go unpaired
        return state

    # ---- paired comparisons --------------------------------------------------------------------------------------
    def score_phases(self, examples: list[dspy.Example]) -> list[PairedComparison]:
        """Every phase's saved program scored on ``examples`` (e.g. the test split), and each phase against the
        program it started from, written to ``paired.md`` / ``paired.json`` under the validation comparisons.

        All the programs run over one pool of ``ReplayWorker``s: a worker sent a prompt that another program sent it
        answers with the same completion, so the programs' outcomes differ only by what they do, not by the workers'
        sampling. That pool's memory is this process's, so they are scored here (``num_threads`` at once), not on Ray.
        """
        if not examples:
            raise ConductorError("score_phases needs examples to score the phases on (e.g. the test split)")
        state = self._load_state()
        if state is None:
            raise ConductorError(f"{self.output_dir} holds no compile to score: run compile first")
        scores: dict[str, list[float]] = {}
        replay = None
        try:
            for index, record in enumerate(state["records"]):
                folder = self._phase_folder(index, record["phase"])
                if not folder.exists():
                    logger.warning("%s has no saved program (a compile from before they were saved)", record["phase"])
                    continue
                program = load_program(folder, trust_code=True)
                if replay is None:
                    replay = program.pool.replayed()
                else:
                    program.pool.close()  # its workers' twins in the replayed pool answer for it
                runner = program.copy_with(pool=replay)
                result = evaluate_program(runner, examples, self.metric, threads=self.num_threads)
                scores[record["phase"]] = [float(score) for *_, score in result.results]
                logger.info("%s: %.1f on %d questions, samples shared", record["phase"], result.score, len(examples))
        finally:
            if replay is not None:
                replay.close()
        comparisons = _against_their_start(state["records"], scores)
        self._write_reports(state, test=comparisons)
        return comparisons

    def _write_reports(self, state: dict[str, Any], test: list[PairedComparison] | None = None) -> None:
        """The phase table, and the paired comparisons on validation (and on ``test`` when given)."""
        self._write_table(state["records"])
        sections = {"validation": _against_their_start(state["records"], state["validation_scores"])}
        lines = [
            "Each phase against its start, the program it started from (the best before it), on the same questions; "
            f"a question counts as right at a score of {RIGHT} or more. The interval is Newcombe's for paired "
            "proportions, p McNemar's exact.",
        ]
        if test is not None:
            sections["test"] = test
            lines.append("On test every program ran over one pool of shared worker samples (one answer per prompt).")
        for split, comparisons in sections.items():
            lines += ["", f"## {split}", "", *paired_table(comparisons, a="start", b="phase")]
        (self.output_dir / f"{PAIRED}.md").write_text("\n".join(lines) + "\n")
        rows = {split: [c.as_dict() for c in comparisons] for split, comparisons in sections.items()}
        (self.output_dir / f"{PAIRED}.json").write_text(json.dumps(rows, indent=2))

    def _write_table(self, records: list[dict[str, Any]]) -> None:
        lines = [
            "| phase | validation score | $ per question | tokens per question | kept | seconds | what changed |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in records:
            lines.append(
                f"| {r['phase']} | {r['score']:.1f} | {r['cost_per_question']:.6f} | {r['tokens_per_question']:.0f} "
                f"| {'yes' if r['kept'] else 'no'} | {r['seconds']:.1f} | {r['change']} |"
            )
        (self.output_dir / "phases.md").write_text("\n".join(lines) + "\n")
        (self.output_dir / "phases.json").write_text(json.dumps(records, indent=2))


def _against_their_start(records: list[dict[str, Any]], scores: dict[str, list[float]]) -> list[PairedComparison]:
    """Each phase after the start against the program it started from (the last kept before it), where both have
    ``scores``."""
    comparisons, started_from = [], records[0]["phase"]
    for record in records[1:]:
        phase = record["phase"]
        if phase in scores and started_from in scores:
            comparisons.append(paired_comparison(scores[started_from], scores[phase], a=started_from, b=phase))
        if record["kept"]:
            started_from = phase
    return comparisons


def warn_if_small(validation_questions: int) -> None:
    """Warn when the validation set is too small to tell a phase's gain from noise: the gain it can't tell is the
    half-width of the 95% (Wilson) interval of an accuracy near 50%, about that of a paired difference where the
    two programs disagree on a quarter of the questions."""
    if validation_questions >= ENOUGH_VALIDATION:
        return
    low, high = wilson_interval(validation_questions / 2, validation_questions)
    logger.warning(
        "the validation set has %d questions: one question is %.1f points; a gain under %.0f points can't be told from "
        "noise (use at least %d validation questions)",
        validation_questions,
        100 / validation_questions,
        100 * (high - low) / 2,
        ENOUGH_VALIDATION,
    )
