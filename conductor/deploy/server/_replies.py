"""The server's HTTP responses: compact JSON, OpenAI error objects (with ``WWW-Authenticate`` on a 401) and
server-sent events, made with the web framework's ``Response`` class, which is passed in because FastAPI is imported
only when an app is made."""

import dataclasses
import json
from typing import Any

from conductor.deploy.server._schema import RequestError


@dataclasses.dataclass(frozen=True)
class Replies:
    """Makes responses with ``response`` (``fastapi.Response``)."""

    response: Any

    def json(self, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Any:
        # ASCII JSON: a lone surrogate a client sent (and an error message quotes) can't be encoded as UTF-8.
        content = json.dumps(body, allow_nan=False, separators=(",", ":"))
        return self.response(content, status, headers, media_type="application/json")

    def error(self, error: RequestError, headers: dict[str, str] | None = None) -> Any:
        if error.status == 401:
            headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
        return self.json(error.body(), error.status, headers)

    def events(self, events: str, headers: dict[str, str]) -> Any:
        return self.response(events, 200, headers, media_type="text/event-stream")
