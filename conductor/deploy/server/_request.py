"""Reading a chat request: its body (size-limited), parsed and validated as OpenAI's, checked against what the
program can honour, and turned into the program's inputs. Each problem is a ``RequestError`` naming it."""

import json
from typing import Any

import dspy
import pydantic

from conductor.deploy.server._schema import ChatRequest, Message, RequestError
from conductor.errors import validation_problems


async def read_body(request: Any, limit: int) -> bytes:
    """The body, or a 413 as soon as it (or its declared length) passes ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)


def _too_large(limit: int) -> RequestError:
    return RequestError(413, f"the request body is larger than {limit:,} bytes", "request_too_large")


def parse(body: bytes) -> ChatRequest:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, a number of over 4,300 digits, deep nesting
        raise RequestError(400, f"the request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(data, dict):
        raise RequestError(400, "the request body must be a JSON object", "invalid_request")
    try:
        return ChatRequest.model_validate(data)
    except pydantic.ValidationError as exc:
        problems = "; ".join(validation_problems(exc, "(body)"))
        param = ".".join(str(part) for part in exc.errors()[0]["loc"]) or None
        raise RequestError(400, f"invalid request: {problems}", "invalid_request", param=param) from None


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
    try:
        inputs = json.loads(question)
    except json.JSONDecodeError:
        inputs = None
    if not isinstance(inputs, dict) or set(names) - set(inputs):
        raise RequestError(400, f"this program takes {names}: send a JSON object with them", "invalid_input")
    return {name: inputs[name] for name in names}
