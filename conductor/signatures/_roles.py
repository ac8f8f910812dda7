"""Built-in worker roles. A role is an ordinary ``dspy.Signature``: its docstring is the worker's instructions
(which prompt optimizers may rewrite) and its single output field receives the worker's whole completion.

The executor fills the input fields it knows: ``question`` (the overall task), ``context`` (the earlier steps this
step may see) and ``subtask`` (this step's instruction). A user role declares any subset of them.
"""

import dspy

ROLE_INPUTS = ("question", "context", "subtask")


class Solve(dspy.Signature):
    """You are one worker in a team solving a task step by step. Carry out your subtask completely and
    correctly. Use the earlier steps you are shown when they help, but check them rather than trust them.
    If your subtask asks for the final answer, end with a line of the form "Answer: <answer>"."""

    question: str = dspy.InputField(desc="the overall task")
    context: str = dspy.InputField(desc="earlier steps you may see: their subtasks and responses")
    subtask: str = dspy.InputField(desc="what you must do now")
    response: str = dspy.OutputField()


class Plan(dspy.Signature):
    """You are the planner of a team. Do not solve the task. Break it into a short numbered list of concrete
    steps that another worker can follow, naming the facts, formulas or checks each step needs and the form the
    final answer must take."""

    question: str = dspy.InputField(desc="the overall task")
    context: str = dspy.InputField(desc="earlier steps you may see: their subtasks and responses")
    subtask: str = dspy.InputField(desc="what you must plan")
    response: str = dspy.OutputField(desc="a numbered plan")


class Verify(dspy.Signature):
    """You are the verifier of a team. Check the earlier responses you are shown against the task: recompute
    results, test edge cases, look for wrong assumptions. Say whether the latest answer is correct. If it is not,
    give the corrected answer. End with a line "Answer: <the answer you stand behind>"."""

    question: str = dspy.InputField(desc="the overall task")
    context: str = dspy.InputField(desc="the earlier steps to check")
    subtask: str = dspy.InputField(desc="what to verify")
    response: str = dspy.OutputField(desc="the verdict, the reasons and the answer")


class Refine(dspy.Signature):
    """You improve an earlier response. Keep what is right, fix what is wrong or missing, and return the complete
    improved response (not a list of changes). End with a line "Answer: <answer>" when the task has one."""

    question: str = dspy.InputField(desc="the overall task")
    context: str = dspy.InputField(desc="the earlier responses to improve, with any feedback on them")
    subtask: str = dspy.InputField(desc="what to improve")
    response: str = dspy.OutputField(desc="the complete improved response")


class Aggregate(dspy.Signature):
    """You combine several candidate responses into one. Compare them, prefer what most of them agree on unless
    the reasoning shows the majority is wrong, and write one final response. End with a line
    "Answer: <answer>"."""

    question: str = dspy.InputField(desc="the overall task")
    context: str = dspy.InputField(desc="the candidate responses")
    subtask: str = dspy.InputField(desc="how to combine them")
    response: str = dspy.OutputField(desc="the single combined response")


BUILTIN_ROLES: tuple[type[dspy.Signature], ...] = (Solve, Plan, Verify, Refine, Aggregate)


def role_name(role: type[dspy.Signature]) -> str:
    """The name the conductor writes for a role: its class name in lower case (``Verify`` -> ``"verify"``)."""
    return role.__name__.lower()


def role_problems(role: type[dspy.Signature]) -> list[str]:
    """What keeps ``role`` from being usable by the executor (empty when it is usable)."""
    problems = []
    unknown = set(role.input_fields) - set(ROLE_INPUTS)
    if unknown:
        problems.append(
            f"role {role.__name__} has input fields the executor can't fill: {sorted(unknown)} "
            f"(use some of {list(ROLE_INPUTS)})"
        )
    if len(role.output_fields) != 1:
        problems.append(f"role {role.__name__} must have exactly one output field, has {list(role.output_fields)}")
    return problems
