"""MkDocs hooks that write the reference pages from the code, so that they change when a flag or a field does.

A page asks for generated text with a marker on a line of its own:

    <!-- cli-reference -->                                   every subcommand's ``--help``, from the parser
                                                             ``conductor`` itself builds
    <!-- config-schema conductor.cli:RunConfig -->           the fields of a pydantic model (or dataclass), then of
                                                             every model its fields hold, however nested
    <!-- config-schema conductor.bench:METHODS -->           a registry of named types: each name's ``args`` model

Only public names of the package are used (``../shared/tools/check_layers.py`` checks scripts under ``docs/``).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import pkgutil
import re
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from unittest import mock

import pydantic
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from conductor.cli import build_parser

MARKER = re.compile(r"^<!-- (cli-reference|config-schema)(?: (\S+))? -->$", re.M)
HELP_COLUMNS = "80"
"""The width ``--help`` is wrapped to on the page (argparse reads ``$COLUMNS``), the same on every machine."""
BOUNDS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "length ≥", "max_length": "length ≤"}


def on_page_markdown(markdown: str, **_: object) -> str:
    """MkDocs calls this with each page's Markdown before rendering it: each marker becomes its generated text."""
    return MARKER.sub(lambda marker: GENERATORS[marker[1]](marker[2]), markdown)


# ---- the command line ------------------------------------------------------------------------------------------------
def cli_reference(_: str | None = None) -> str:
    """A heading and the ``--help`` text of ``conductor`` and of each subcommand, nested ones (``keys add``) too."""
    sections = []
    with mock.patch.dict(os.environ, {"COLUMNS": HELP_COLUMNS}):
        for path, parser in command_parsers(build_parser(), ("conductor",)):
            sections.append(f"{'#' * (len(path) + 1)} `{' '.join(path)}`\n\n```text\n{parser.format_help()}```")
    return "\n\n".join(sections)


def command_parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``parser`` and, depth first, the parser of every subcommand below it, each with its command words."""
    yield path, parser
    for action in parser._actions:  # argparse lists its subcommands nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield from command_parsers(subparser, (*path, name))


# ---- config files --------------------------------------------------------------------------------------------------
def config_schema(target: str | None) -> str:
    """The tables of the model (or registry of named types) at ``target``, ``module:name``."""
    if not target:
        raise ValueError("a config-schema marker names a model: <!-- config-schema module:Name -->")
    found = pkgutil.resolve_name(target)
    if isinstance(found, Mapping):  # a registry: name -> a type whose `args` model holds that name's options
        return "\n\n".join(f"#### `{name}`\n\n{model_tables(kind.args, level=5)}" for name, kind in found.items())
    return model_tables(found, level=3)


def model_tables(root: type, level: int) -> str:
    """A heading, docstring and field table for ``root`` and for every model its fields hold."""
    return "\n\n".join(model_table(model, level) for model in models_within(root))


def models_within(root: type) -> list[type]:
    """``root`` and every model or dataclass its fields hold (``list[X]``, ``X | None``, ...), each once, breadth
    first."""
    models = [root]
    for model in models:  # the list grows while it is walked
        for field in fields_of(model).values():
            models += [inner for inner in types_in(field.annotation) if is_model(inner) and inner not in models]
    return models


def model_table(model: type, level: int) -> str:
    name = model.__name__.lstrip("_")
    rows = [
        f"| `{key}` | {cell(type_text(field.annotation, field.metadata))} | {cell(default_text(field))} "
        f"| {cell(field.description or '')} |"
        for key, field in fields_of(model).items()
    ]
    # Stdlib dataclasses get a generated signature as their docstring when they have none: not worth showing.
    doc = "" if (model.__doc__ or "").startswith(f"{model.__name__}(") else inspect.cleandoc(model.__doc__ or "")
    header = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    table = "\n".join([*header, *rows]) if rows else "No keys."
    return "\n\n".join(part for part in (f"{'#' * level} {name}", doc, table) if part)


def fields_of(model: type) -> dict[str, FieldInfo]:
    """A pydantic model's fields, or a dataclass's as pydantic sees them."""
    if issubclass(model, pydantic.BaseModel):
        return model.model_fields
    hints = typing.get_type_hints(model, include_extras=True)  # a field's description is in its Annotated
    return {
        field.name: FieldInfo.from_annotated_attribute(
            hints[field.name], PydanticUndefined if field.default is dataclasses.MISSING else field.default
        )
        for field in dataclasses.fields(model)
    }


def is_model(candidate: object) -> bool:
    return isinstance(candidate, type) and (
        issubclass(candidate, pydantic.BaseModel) or dataclasses.is_dataclass(candidate)
    )


def types_in(annotation: object) -> Iterator[object]:
    yield annotation
    for argument in typing.get_args(annotation):
        yield from types_in(argument)


def type_text(annotation: object, metadata: Sequence[object] = ()) -> str:
    """How a config file writer reads ``annotation``: ``int | None``, ``list[WorkerSpec]``, ``'usd' | 'tokens'``, with
    the field's bounds (``≥ 1``); a model's name links to its table."""
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        text = type_text(arguments[0])
    elif origin in (typing.Union, types.UnionType):
        text = " | ".join(type_text(argument) for argument in arguments)
    elif origin is typing.Literal:
        text = " | ".join(repr(argument) for argument in arguments)
    elif origin is not None:
        text = f"{getattr(origin, '__name__', origin)}[{', '.join(type_text(argument) for argument in arguments)}]"
    elif annotation is Ellipsis or annotation is type(None):
        text = "..." if annotation is Ellipsis else "None"
    elif is_model(annotation):
        name = annotation.__name__.lstrip("_")
        text = f"[{name}](#{name.lower()})"
    else:
        text = getattr(annotation, "__name__", str(annotation))
    bounds = [f"{sign} {getattr(item, key)}" for item in metadata for key, sign in BOUNDS.items() if has(item, key)]
    return ", ".join([text, *bounds])


def has(item: object, key: str) -> bool:
    return getattr(item, key, None) is not None


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    default = field.get_default(call_default_factory=True)
    if is_model(type(default)):
        return "its defaults"
    return f"`{default}`" if isinstance(default, os.PathLike) else f"`{default!r}`"


def cell(text: str) -> str:
    """``text`` inside a Markdown table cell: on one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


GENERATORS = {"cli-reference": cli_reference, "config-schema": config_schema}
