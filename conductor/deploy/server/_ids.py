"""Ids: a cheap unique one for each completion and request, and the middleware that puts ``x-request-id`` on every
response (the client's own, when it sent a safe one)."""

import itertools
import re
import uuid
from typing import Any

_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_ID_PREFIX, _ID_COUNTER = uuid.uuid4().hex[:16], itertools.count()


def new_id() -> str:
    """A new id, unique across processes (a random prefix per process) and cheap: no random bytes per request,
    whose system call hands the GIL to the run threads and waits to get it back."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


class RequestIds:
    """ASGI middleware: every HTTP response carries ``x-request-id``, the client's (when it is 1-128 characters of
    ``[A-Za-z0-9._:-]``, so it can't inject anything into a header or a log) or a new one; handlers read it from
    ``request.state.request_id``."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = sent if _CLIENT_REQUEST_ID.fullmatch(sent) else f"req-{new_id()}"
        scope.setdefault("state", {})["request_id"] = request_id
        header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        await self.app(scope, receive, send_with_id)
