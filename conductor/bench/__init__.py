"""The benchmark runner: methods x datasets x seeds from one YAML config, resumable, with a report.

``conductor bench CONFIG`` runs it (the repository's ``experiments/`` folder keeps the configs and their results, and
is not part of the package); from Python::

    config = load_config("experiments/configs/simulated_controlled.yaml")
    records = run_benchmark(config)         # one record per (method, dataset, seed, example), resumable
    write_report(config, records)           # results.json, table.md, plot.png in config.output
"""

from conductor.bench._config import (
    DATASETS,
    METHODS,
    BenchConfig,
    DatasetSpec,
    DatasetType,
    MethodSpec,
    MethodType,
    load_config,
    validate_config,
)
from conductor.bench._plots import plot_accuracy_cost
from conductor.bench._report import markdown_report, shapes_table, write_report
from conductor.bench._results import (
    ALL,
    Aggregate,
    Shapes,
    aggregate,
    shape_text,
    summarise,
    wilson_interval,
    workflow_shapes,
)
from conductor.bench._run import RESULTS_FILE, ResultsFile, Unit, run_benchmark, run_unit, workflow_shape

__all__ = [
    "ALL",
    "DATASETS",
    "METHODS",
    "RESULTS_FILE",
    "Aggregate",
    "BenchConfig",
    "DatasetSpec",
    "DatasetType",
    "MethodSpec",
    "MethodType",
    "ResultsFile",
    "Shapes",
    "Unit",
    "aggregate",
    "load_config",
    "markdown_report",
    "plot_accuracy_cost",
    "run_benchmark",
    "run_unit",
    "shape_text",
    "shapes_table",
    "summarise",
    "validate_config",
    "wilson_interval",
    "workflow_shape",
    "workflow_shapes",
    "write_report",
]
