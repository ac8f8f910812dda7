"""Workers: the one interface every worker kind implements (``Worker``, with its contract), the LM-backed worker, the
plain wrappers (a tool or DSPy module as a worker, a worker that replays answers) and a worker's call limits."""

from conductor.modules.workers._limits import CallLimits
from conductor.modules.workers._replay import ReplayStore, ReplayWorker
from conductor.modules.workers._tools import TRUNCATED, ModuleWorker, ToolWorker, as_worker
from conductor.modules.workers._worker import (
    FREE,
    Completion,
    LMWorker,
    Messages,
    Price,
    Worker,
    chat_request,
    context_window,
    litellm_price,
    lm_price,
    prompt_tokens,
)

__all__ = [
    "FREE",
    "TRUNCATED",
    "CallLimits",
    "Completion",
    "LMWorker",
    "Messages",
    "ModuleWorker",
    "Price",
    "ReplayStore",
    "ReplayWorker",
    "ToolWorker",
    "Worker",
    "as_worker",
    "chat_request",
    "context_window",
    "litellm_price",
    "lm_price",
    "prompt_tokens",
]
