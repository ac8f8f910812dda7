"""Program search: candidate workflows generated from the pool (``_space.py``) with first-step instructions proposed
from the training answers (``_propose.py``), scored on the training questions with shared samples and dropped early
(``_search.py``), reported as an oracle table (``_report.py``), and taught to the conductor per question over random
pools (``_teach.py``), so that no person writes the workflows."""

from conductor.optimizers.search._propose import proposed_subtasks
from conductor.optimizers.search._report import groups, oracle_rows, write_search_report
from conductor.optimizers.search._search import Outcome, ProgramSearchConfig, SearchCost, SearchResult, program_search
from conductor.optimizers.search._space import Candidate, candidate_space
from conductor.optimizers.search._teach import searched_workflows

__all__ = [
    "Candidate",
    "Outcome",
    "ProgramSearchConfig",
    "SearchCost",
    "SearchResult",
    "candidate_space",
    "groups",
    "oracle_rows",
    "program_search",
    "proposed_subtasks",
    "searched_workflows",
    "write_search_report",
]
