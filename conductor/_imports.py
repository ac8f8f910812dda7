"""Objects named by ``module:qualname`` strings, as configs and saved programs name tools, roles and classes."""

from __future__ import annotations

import importlib
from typing import Any

from conductor.errors import ConfigError


def import_object(path: str, what: str = "") -> Any:
    """The object at ``path`` (``"package.module:Name"`` or ``"package.module:Outer.inner"``); a ``ConfigError``
    saying ``can't import <what><path>`` when it isn't there."""
    module_name, _, qualname = path.partition(":")
    try:
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"can't import {what}{path!r}: {exc}") from exc
    return obj
