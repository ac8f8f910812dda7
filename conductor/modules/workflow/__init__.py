"""The workflow language: ``Workflow`` (the steps a conductor writes, parsed tolerantly, validated precisely, written
back), its text format's vocabulary (the field names and the access keyword, which the grammar in
``conductor.conductor_lm`` also spells), and the prompts built from it: the plain text a worker sees for a step
(``WorkerPromptAdapter``) and the conductor's own (``WorkflowAdapter``)."""

from conductor.modules.workflow._prompts import (
    DIRECT_SUBTASK,
    INPUT_TITLES,
    QUESTION_ALONE,
    WORKFLOW_FIELDS,
    WorkerPromptAdapter,
    WorkflowAdapter,
    is_workflow_demo,
    workflow_fields,
)
from conductor.modules.workflow._workflow import (
    ACCESS_ALL,
    ACCESS_LIST_FIELD,
    LIST_NAMES,
    MODEL_ID_FIELD,
    REASONING_FIELD,
    ROLES_FIELD,
    SUBTASKS_FIELD,
    TEXT_FIELDS,
    Access,
    Limits,
    Step,
    Workflow,
)

__all__ = [
    "ACCESS_ALL",
    "ACCESS_LIST_FIELD",
    "DIRECT_SUBTASK",
    "INPUT_TITLES",
    "LIST_NAMES",
    "MODEL_ID_FIELD",
    "QUESTION_ALONE",
    "REASONING_FIELD",
    "ROLES_FIELD",
    "SUBTASKS_FIELD",
    "TEXT_FIELDS",
    "WORKFLOW_FIELDS",
    "Access",
    "Limits",
    "Step",
    "WorkerPromptAdapter",
    "Workflow",
    "WorkflowAdapter",
    "is_workflow_demo",
    "workflow_fields",
]
