"""The experiment runner: methods x datasets x seeds from one YAML config, resumable, with a report.

``conductor bench CONFIG`` runs it; from Python::

    config = load_config("experiments/configs/simulated_controlled.yaml")
    records = run_benchmark(config)         # one record per (method, dataset, seed, example), resumable
    write_report(config, records)           # results.json, table.md, plot.png in config.output
"""

from conductor.experiments._config import (
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
from conductor.experiments._plots import plot_accuracy_cost
from conductor.experiments._report import markdown_report, write_report
from conductor.experiments._results import (
    ALL,
    Aggregate,
    Shapes,
    aggregate,
    shape_text,
    summarise,
    wilson_interval,
    workflow_shapes,
)
from conductor.experiments._run import RESULTS_FILE, ResultsFile, Unit, run_benchmark, run_unit

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
    "summarise",
    "validate_config",
    "wilson_interval",
    "workflow_shapes",
    "write_report",
]
