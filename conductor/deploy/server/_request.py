"""Reading a chat request: its body (size- and time-limited), parsed and validated as OpenAI's, checked against what
the program can honour, and turned into the program's inputs. Each problem is a ``RequestError`` naming it."""

import asyncio
import json
import math
from typing import Any

import dspy
import pydantic

from conductor.deploy.server._schema import ChatRequest, Message, RequestError
from conductor.errors import validation_problems

MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects a request may have: OpenAI's requests nest a few levels, and what
reads a request (the audit log's redaction, the program) recurses into it."""

CLIENT_DISCONNECTED = 499
"""The status of a request whose client left before sending it all (nginx's; no one receives it)."""


async def read_body(request: Any, limit: int, timeout_s: float) -> bytes:
    """The body; a 413 as soon as it (or its declared length) passes ``limit`` bytes, a 408 when it has not all
    arrived within ``timeout_s``, a 499 when the client disconnects first."""
    from starlette.requests import ClientDisconnect  # the web framework is imported only when an app is made

    try:  # a declared length is only a shortcut to an early 413: what arrives is counted below
        declared = int(request.headers.get("content-length", ""))
    except ValueError:  # absent, not a number, or over Python's 4,300-digit limit
        declared = 0
    if declared > limit:
        raise _too_large(limit)
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise _too_large(limit)
    except TimeoutError:
        raise RequestError(
            408, f"the request body did not arrive within {timeout_s:g} s", "request_timeout", "timeout_error"
        ) from None
    except ClientDisconnect:
        raise RequestError(
            CLIENT_DISCONNECTED, "the client disconnected before sending the whole body", "client_disconnected"
        ) from None
    return bytes(body)


def _too_large(limit: int) -> RequestError:
    return RequestError(413, f"the request body is larger than {limit:,} bytes", "request_too_large")


def parse(body: bytes) -> ChatRequest:
    data = loads(body, "the request body")
    if not isinstance(data, dict):
        raise RequestError(400, "the request body must be a JSON object", "invalid_request")
    try:
        return ChatRequest.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = "; ".join(validation_problems(exc, "(body)"))
        param = ".".join(str(part) for part in exc.errors()[0]["loc"]) or None
        raise RequestError(400, f"invalid request: {problems}", "invalid_request", param=param) from None


def loads(text: str | bytes, what: str) -> Any:
    """``text`` parsed as JSON, or a 400 naming ``what``: for text that is not JSON or not UTF-8, NaN or an infinity
    (JavaScript's, not JSON's), a number of over 4,300 digits (Python's int-from-str limit), or nesting deeper than
    ``MAX_JSON_DEPTH``."""
    try:
        data = json.loads(text, parse_constant=_not_json, parse_float=_finite)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested some thousand levels deep
        raise RequestError(400, f"{what} is not valid JSON: {exc}", "invalid_json") from None
    if _too_deep(data):
        raise RequestError(
            400, f"{what} nests arrays and objects more than {MAX_JSON_DEPTH} levels deep", "invalid_json"
        )
    return data


def _not_json(constant: str) -> float:
    raise ValueError(f"{constant} is not a JSON value")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"the number {text[:20]} is too large for a 64-bit float")
    return number


def _too_deep(data: Any) -> bool:
    """Whether ``data`` nests arrays and objects more than ``MAX_JSON_DEPTH`` levels deep (found without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_JSON_DEPTH:
                return True
            stack.extend((child, depth + 1) for child in (value.values() if isinstance(value, dict) else value))
    return False


def unknown_model(name: str, model: str) -> RequestError:
    return RequestError(
        404, f"the model {name!r} does not exist: this server serves {model!r}", "model_not_found", param="model"
    )


def check_request(chat: ChatRequest, model: str) -> None:
    """A 404 for another model; a 400 for a parameter the program can't honour (see ``conductor.deploy.server``'s
    docstring), rather than ignoring it."""
    if chat.model is not None and chat.model != model:
        raise unknown_model(chat.model, model)
    if chat.n not in (None, 1):
        raise RequestError(400, f"n={chat.n}: the program writes one answer per request", "unsupported", param="n")
    kind = (chat.response_format or {}).get("type", "text")
    if kind != "text":
        raise RequestError(
            400,
            f"response_format {kind!r} is not supported: the program answers in free text, send 'text'",
            "unsupported",
            param="response_format",
        )
    for name in ("tools", "functions"):
        if (chat.model_extra or {}).get(name):
            raise RequestError(
                400, f"{name} are not supported: the program calls no client tools", "unsupported", param=name
            )


def question_text(messages: list[Message]) -> str:
    """The last user message's text (a string, or its text parts joined by newlines)."""
    user = next((m for m in reversed(messages) if m.role == "user"), None)
    if user is None or user.content is None:
        raise RequestError(400, "the messages hold no user message with content", "no_user_message", param="messages")
    if isinstance(user.content, str):
        text = user.content
    elif any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in user.content):
        raise RequestError(400, "only text content parts are supported", "unsupported_content", param="messages")
    else:
        text = "\n".join(part["text"] for part in user.content)
    try:
        text.encode()
    except UnicodeEncodeError as exc:  # JSON's "\ud800" escapes decode to text no model or file can take
        raise RequestError(
            400,
            f"the question is not valid Unicode: a lone surrogate at character {exc.start}",
            "invalid_text",
            param="messages",
        ) from None
    return text


def program_inputs(signature: type[dspy.Signature], question: str) -> dict[str, Any]:
    """The program's inputs: the question for a one-input signature, else a JSON object naming every input."""
    names = list(signature.input_fields)
    if len(names) == 1:
        return {names[0]: question}
    wanted = f"this program takes {names}: send a JSON object with them"
    try:
        inputs = loads(question, "the question")
    except RequestError as exc:
        raise RequestError(400, f"{wanted} ({exc.message})", "invalid_input") from None
    if not isinstance(inputs, dict) or set(names) - set(inputs):
        raise RequestError(400, wanted, "invalid_input")
    return {name: inputs[name] for name in names}
