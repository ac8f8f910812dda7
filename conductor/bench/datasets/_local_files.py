"""Questions and answers from one's own JSONL, CSV or Parquet file, read through Hugging Face ``datasets``' local
loaders (no hub access), with the rows that can't be used reported rather than crashed on.

A config names the file, the fields that make the question (``inputs``), the field holding the answer, and a metric
(``exact``, ``number``, ``choice`` or ``module:function``). ``choice`` also needs the options: one field holding a
list, or several fields holding one option each; the answer is then an option's label (A, B, ...) or its text.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import dspy
import pydantic

from conductor._files import ConfigPath
from conductor.bench.datasets._cache import cache_dir
from conductor.bench.datasets._example import make_example
from conductor.errors import ConfigError, MissingDependency, did_you_mean
from conductor.modules import format_options, option_labels

logger = logging.getLogger(__name__)

Format = Literal["jsonl", "json", "csv", "parquet"]
_SUFFIXES: dict[str, Format] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_SHOWN = 5  # bad rows named in the report; the rest are counted
_RESERVED = ("question", "answer", "family")  # example fields the loader writes itself


class BadRow(NamedTuple):
    """A row left out: its number (a JSON Lines file's line number; else 1 is the first record, a CSV's header not
    being one) and why."""

    number: int
    reason: str


class FileRows(NamedTuple):
    """What a file gave: the usable examples, the rows left out, and how many records it had."""

    examples: list[dspy.Example]
    bad: list[BadRow]
    records: int

    def report(self) -> str:
        """One line: how many rows were left out, and which (the first few) with why."""
        shown = "; ".join(f"row {row.number}: {row.reason}" for row in self.bad[:_SHOWN])
        more = f"; and {len(self.bad) - _SHOWN} more" if len(self.bad) > _SHOWN else ""
        return f"skipped {len(self.bad)} of {self.records} rows ({shown}{more})"


class DataFile(pydantic.BaseModel):
    """A local data file and how its records become examples (the ``file`` of a config; its path relative to the
    config file)."""

    model_config = pydantic.ConfigDict(extra="forbid")
    path: ConfigPath = pydantic.Field(description="the JSONL, CSV or Parquet file, relative to the config file")
    format: Format | None = pydantic.Field(None, description="default: from the file's suffix")
    inputs: list[str] = pydantic.Field(["question"], min_length=1, description="the fields that make the question")
    answer: str = pydantic.Field("answer", min_length=1, description="the field holding the answer")
    options: str | list[str] | None = pydantic.Field(
        None, description="for multiple choice: a field holding the options, or one field per option"
    )

    @pydantic.model_validator(mode="after")
    def _check(self) -> DataFile:
        if self.format is None and self.path.suffix.lower() not in _SUFFIXES:
            raise ValueError(f"can't tell the format of {self.path.name}: name it in `format` ({list(_SUFFIXES)})")
        fields = self._fields()
        repeated = sorted({f for f in fields if fields.count(f) > 1})
        if repeated:
            raise ValueError(f"a field can't be both an input, the answer or an option: {repeated}")
        if isinstance(self.options, list) and len(self.options) < 2:
            raise ValueError("options: name one field holding a list, or at least two fields")
        return self

    def _fields(self) -> list[str]:
        """The fields this reads: the inputs, the answer and the options."""
        option_fields = [self.options] if isinstance(self.options, str) else self.options or []
        return [*self.inputs, self.answer, *option_fields]

    @property
    def kind(self) -> Format:
        return self.format or _SUFFIXES[self.path.suffix.lower()]

    def read(self, metric: str = "exact") -> FileRows:
        """The file's usable records as examples (input ``question``, labels ``answer``, ``family`` (the file's name),
        ``options`` and the record's other fields), logging a warning that names the rows left out.

        ``metric`` decides what a usable answer is: a number for ``number``, an option for ``choice`` (which needs
        ``options``); any non-empty value otherwise. ``ConfigError`` when the file can't be read or has no usable row.
        """
        if metric == "choice" and self.options is None:
            raise ConfigError(f"the choice metric needs `options`: the field(s) of {self.path.name} holding them")
        records = self._records()
        self._check_columns(records)
        examples, bad = [], []
        for number, record in records:
            try:
                examples.append(self._example(record, metric))
            except _Unusable as exc:
                bad.append(BadRow(number, str(exc)))
        rows = FileRows(examples, bad, len(records))
        if not examples:
            raise ConfigError(f"{self.path} has no usable row: {rows.report()}")
        if bad:
            logger.warning("%s: %s", self.path, rows.report())
        return rows

    # ---- reading -------------------------------------------------------------------------------------------------
    def _records(self) -> list[tuple[int, Any]]:
        """The records with their row numbers; a JSON Lines line that doesn't parse stays as its text (a bad row
        later), and a blank one is no record."""
        if not self.path.is_file():
            raise ConfigError(f"no data file {self.path}")
        kind = self.kind
        if kind == "jsonl":
            # One line a record, parsed here: datasets' json loader fails on the whole file for one bad line, and
            # unifies a column's types across rows (a "4" among numbers becomes 4).
            lines = enumerate((row["text"] for row in _load("text", self.path)), start=1)
            return [(number, _parsed_line(line)) for number, line in lines if line.strip()]
        if kind == "csv":  # the named fields' cells stay as written ("007", "1.50"), an empty one ""
            rows = _load(kind, self.path, converters=dict.fromkeys(self._fields(), str), na_filter=False)
        else:
            rows = _load(kind, self.path)
        return list(enumerate(rows, start=1))

    def _check_columns(self, records: list[tuple[int, Any]]) -> None:
        """A ``ConfigError`` when a field this reads is in no record: every row would be left out for it."""
        found = list(dict.fromkeys(key for _, record in records if isinstance(record, dict) for key in record))
        missing = [name for name in self._fields() if name not in found]
        if found and missing:
            named = ", ".join(f"{name!r}{did_you_mean(name, found)}" for name in missing)
            raise ConfigError(
                f"{self.path.name} has no column {named}: its columns are {found}, and {self._fields()} were expected "
                "(name its columns in the file's `inputs`, `answer` and `options`)"
            )

    def _example(self, record: Any, metric: str) -> dspy.Example:
        if not isinstance(record, dict):
            raise _Unusable(
                "not a JSON object" if isinstance(record, str) else f"a {type(record).__name__}, not a record"
            )
        values = {name: _field(record, name) for name in self.inputs}
        question = (
            next(iter(values.values())) if len(values) == 1 else "\n".join(f"{k}: {v}" for k, v in values.items())
        )
        answer = _field(record, self.answer)
        labels = {k: v for k, v in record.items() if k not in {*self.inputs, self.answer, *_RESERVED}}
        if self.options is not None:
            options = self._options(record)
            answer = _choice_label(answer, options)
            labels["options"] = options
            question = f"{question}\n\n{format_options(options)}"
        elif metric == "number" and not _is_number(answer):
            raise _Unusable(f"{self.answer!r} is {answer!r}, not a number")
        return make_example(question, answer, self.path.stem, **labels)

    def _options(self, record: dict[str, Any]) -> tuple[str, ...]:
        if isinstance(self.options, list):
            return tuple(_field(record, name) for name in self.options)
        value = record.get(self.options)
        if not isinstance(value, list) or len(value) < 2:
            raise _Unusable(f"{self.options!r} is {_shown(value)}, not a list of at least two options")
        return tuple(_text(item, f"{self.options}[{i}]") for i, item in enumerate(value))


class _Unusable(ValueError):
    """Why a record can't become an example."""


def _load(kind: str, path: Path, **options: Any) -> Sequence[dict[str, Any]]:
    try:
        import datasets
    except ImportError as exc:
        raise MissingDependency(
            f"reading a data file needs datasets: pip install 'dspy-conductor[data]' ({exc})"
        ) from exc
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a few-hundred-row file needs none, and the CLI's output stays clean
    try:
        return datasets.load_dataset(
            kind, data_files=str(path), split="train", cache_dir=str(cache_dir() / "files"), **options
        )
    except Exception as exc:  # datasets and pyarrow raise many kinds for a file they can't parse
        raise ConfigError(f"can't read {path} as {kind}: {exc}") from exc
    finally:
        if bars:
            datasets.enable_progress_bars()


def _parsed_line(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return line


def _field(record: dict[str, Any], name: str) -> str:
    if name not in record or _missing(record[name]):
        raise _Unusable(f"no {name!r}")
    return _text(record[name], name)


def _text(value: Any, name: str) -> str:
    """A scalar as text (a whole float as an integer: 4.0 is "4"); ``_Unusable`` for an empty or non-scalar value."""
    if isinstance(value, bool) or not isinstance(value, str | int | float) or _missing(value):
        raise _Unusable(f"{name!r} is {_shown(value)}, not text or a number")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    if not text:
        raise _Unusable(f"{name!r} is empty")
    return text


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text.replace(",", "")))
    except ValueError:
        return False


def _choice_label(answer: str, options: tuple[str, ...]) -> str:
    """The label of the option ``answer`` names (by label, in any case, or by its exact text)."""
    labels = option_labels(len(options))
    if answer.upper() in labels:
        return answer.upper()
    if answer in options:
        return labels[options.index(answer)]
    raise _Unusable(f"the answer {answer!r} is neither an option nor one of the labels {labels[0]}-{labels[-1]}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
