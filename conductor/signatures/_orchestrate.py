"""The conductor's own signatures: read a task and a pool, write a workflow (the paper's lists); in a recursive round,
review the previous workflow's answer and keep it or write a new workflow."""

import dspy

_RULES = """Rules:
- Write at most `max_steps` steps. Easy questions need one or two steps; hard ones may plan, solve and verify.
- `model_id[i]` is the worker for step i as the worker list writes it: its number (Model 0, Model 1, ...) or
  its name.
- `subtasks[i]` is a clear, self-contained instruction written for that worker.
- `access_list[i]` is "all" to show the worker every earlier step, [] to show none, or a list of earlier step
  numbers.
- `roles[i]` (optional) is one of the available roles; leave it out to use "solve".
- The last step's response is the final answer, so the last subtask must ask for the final answer in the form
  the task needs.
- Give code to run to a code-running worker inside a fenced block, and arithmetic to a calculator as a plain
  expression."""


class Orchestrate(dspy.Signature):
    __doc__ = f"""You are the conductor of a team of worker models. You never answer the task yourself. You write a
workflow: which worker does each step, what exactly it must do, and which earlier steps it may see.

{_RULES}"""

    question: str = dspy.InputField(desc="the task to solve")
    workers: str = dspy.InputField(desc="the workers available, one per line, by number or by name")
    available_roles: str = dspy.InputField(desc="the roles a step may take")
    max_steps: int = dspy.InputField(desc="the most steps the workflow may have")
    reasoning: str = dspy.OutputField(desc="brief thoughts on how to split the task and whom to give each part")
    model_id: list[int] = dspy.OutputField(desc="the worker of each step, by number or by name")
    subtasks: list[str] = dspy.OutputField(desc="the instruction for each step")
    access_list: list[str | list[int]] = dspy.OutputField(desc='for each step: "all", [] or earlier step numbers')
    roles: list[str] = dspy.OutputField(desc="optional: the role of each step")


class Revise(Orchestrate):
    __doc__ = f"""You are the conductor of a team of worker models. You never answer the task yourself. You chose to
review your `previous_workflow` once it had run: it gave `previous_answer`. If that answer is right and in the form
the task needs, keep it by returning empty lists (model_id = [], subtasks = [], access_list = []). Otherwise write a
new workflow that gets it right: which worker does each step, what exactly it must do, and which earlier steps it may
see.

{_RULES}"""

    previous_workflow: str = dspy.InputField(desc="the workflow you wrote in the previous round")
    previous_answer: str = dspy.InputField(desc="the final answer that workflow gave")
