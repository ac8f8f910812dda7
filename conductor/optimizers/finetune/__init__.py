"""The supervised warm start of the conductor policy: a short LoRA fine-tune on valid workflows (``_finetune.py``),
and where those workflows come from: synthetic, templates per task family, or a conductor's predictions that scored
(``_sources.py``).

Importing this package needs no torch; training does, through the policy.
"""

from conductor.optimizers.finetune._finetune import (
    TokenPair,
    TrainingExample,
    WarmStartConfig,
    WarmStartReport,
    completion_ids,
    completion_nll,
    question_for,
    training_pairs,
    warm_start,
)
from conductor.optimizers.finetune._sources import (
    Template,
    TemplateStep,
    TemplateWarmStartConfig,
    check_templates,
    from_predictions,
    kept_pairs,
    preferred_workflows,
    question_key,
    synthetic_workflows,
    template_choices,
    template_workflow,
    templated_workflows,
)

__all__ = [
    "Template",
    "TemplateStep",
    "TemplateWarmStartConfig",
    "TokenPair",
    "TrainingExample",
    "WarmStartConfig",
    "WarmStartReport",
    "check_templates",
    "completion_ids",
    "completion_nll",
    "from_predictions",
    "kept_pairs",
    "preferred_workflows",
    "question_for",
    "question_key",
    "synthetic_workflows",
    "template_choices",
    "template_workflow",
    "templated_workflows",
    "training_pairs",
    "warm_start",
]
