"""A battery of bad requests to the chat route: none gets a 500, each gets an OpenAI error object (or, where the
input is odd but usable, an answer), and each is recorded in the audit log under its request id."""

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from conductor.deploy import AuditLog, KeySpec, KeyStore, create_app, hash_key, new_key
from tests.deploy.test_server import make_program

MAX_BYTES = 64_000
MAX_QUESTION_CHARS = 1_000


def chat(question: object = "Say the number 7.", **extra) -> bytes:
    return json.dumps({"model": "team", "messages": [{"role": "user", "content": question}], **extra}).encode()


def raw(text: str) -> bytes:
    return text.encode()


def nested(depth: int) -> bytes:
    return raw(
        '{"messages": [{"role": "user", "content": "Say the number 7."}], "x": ' + "[" * depth + "]" * depth + "}"
    )


CASES = [
    ("malformed JSON", raw("{not json"), 400),
    ("truncated JSON", raw('{"messages": ['), 400),
    ("not UTF-8", b'\xff\xfe{"messages": 1}', 400),
    ("empty body", b"", 400),
    ("a JSON array", raw("[1, 2]"), 400),
    ("a JSON string", raw('"hello"'), 400),
    ("JSON null", raw("null"), 400),
    ("nested 30,000 deep", nested(30_000), 400),
    ("an integer of 5,000 digits", raw('{"messages": [], "max_tokens": ' + "9" * 5_000 + "}"), 400),
    ("a number too large for a float", chat(max_tokens=None)[:-1] + b', "temperature": 1e400}', 400),
    ("no messages", raw('{"model": "team"}'), 400),
    ("empty messages", raw('{"messages": []}'), 400),
    ("messages a string", raw('{"messages": "hi"}'), 400),
    ("a message a string", raw('{"messages": ["hi"]}'), 400),
    ("a message without a role", raw('{"messages": [{"content": "hi"}]}'), 400),
    ("a role that is a number", raw('{"messages": [{"role": 5, "content": "hi"}]}'), 400),
    ("content a number", chat(42), 400),
    ("content parts that are numbers", chat([1, 2]), 400),
    ("an image content part", chat([{"type": "image_url", "image_url": {"url": "http://x"}}]), 400),
    ("a text part whose text is a number", chat([{"type": "text", "text": 5}]), 400),
    ("no user message", raw('{"messages": [{"role": "system", "content": "hi"}]}'), 400),
    ("null user content", chat(None), 400),
    ("a blank question", chat("   "), 400),
    ("a lone surrogate question", raw('{"messages": [{"role": "user", "content": "Say \\ud800 7."}]}'), 400),
    ("an over-long question", chat("Say the number 7. " * 200), 400),
    ("a body over the limit", chat("x" * (MAX_BYTES + 10)), 413),
    ("stream not a boolean", chat(stream="yes please"), 400),
    ("stream_options not an object", chat(stream=True, stream_options=3), 400),
    ("max_tokens a word", chat(max_tokens="many"), 400),
    ("max_tokens negative", chat(max_tokens=-5), 400),
    ("max_tokens a fraction", chat(max_tokens=1.5), 400),
    ("max_tokens zero", chat(max_completion_tokens=0), 400),
    ("temperature NaN", chat()[:-1] + b', "temperature": NaN}', 400),
    ("a NaN budget", chat()[:-1] + b', "conductor_budget": {"max_cost": NaN}}', 400),
    ("an infinite budget", chat()[:-1] + b', "conductor_budget": {"max_tokens": Infinity}}', 400),
    ("a budget that is a number", chat(conductor_budget=5), 400),
    ("a budget with an unknown field", chat(conductor_budget={"max_stepz": 1}), 400),
    ("a budget limit that is a word", chat(conductor_budget={"max_steps": "two"}), 400),
    ("a budget too small to answer", chat(conductor_budget={"max_tokens": 1}), 400),
    ("model a number", raw('{"model": 5, "messages": [{"role": "user", "content": "hi"}]}'), 400),
    ("an unknown model", raw('{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'), 404),
    ("n of 5", chat(n=5), 400),
    ("response_format a string", chat(response_format="json"), 400),
    ("response_format json_object", chat(response_format={"type": "json_object"}), 400),
    ("tools", chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400),
    # Odd but usable: answered, and audited like any request.
    ("unknown fields at any depth", chat(frobnicate={"deep": [1, {"x": None}]}, logit_bias={"1": 2}), 200),
    ("a lone surrogate in a field name", raw(chat().decode()[:-1] + ', "\\ud800": 1}'), 400),
    ("a lone surrogate in another field", raw(chat().decode()[:-1] + ', "user": "\\udc00"}'), 200),
    ("a NUL in the question", chat("Say the number 7.\u0000"), 200),
    ("a huge max_tokens", chat(max_tokens=10**30, conductor_budget={"max_steps": 10**20}), 200),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("bad-input") / "audit.sqlite"
    program = make_program()
    program.max_question_chars = MAX_QUESTION_CHARS
    app = create_app(program, model="team", max_request_bytes=MAX_BYTES, audit_db=db)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, AuditLog(db)


@pytest.mark.parametrize("body, status", [pytest.param(body, status, id=name) for name, body, status in CASES])
def test_a_bad_request_gets_a_4xx_and_an_audit_row(server, request, body, status):
    client, audit = server
    request_id = f"bad-{abs(hash(request.node.name)):x}"
    response = client.post(
        "/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json", "x-request-id": request_id},
    )
    assert response.status_code == status, response.text
    assert response.headers["x-request-id"] == request_id
    if status != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    [row] = [row for row in audit.read() if row["request_id"] == request_id]
    assert row["outcome"] == "ok" if status == 200 else row["outcome"] in {"input", "budget"}
    assert (row["error"] is None) == (status == 200)


def test_at_least_forty_cases():
    assert len(CASES) >= 40


def test_a_request_without_a_valid_key_is_audited_too(tmp_path):
    key = new_key()
    keys = KeyStore([KeySpec(id="alice", hash=hash_key(key))])
    app = create_app(make_program(), model="team", keys=keys, audit_db=tmp_path / "audit.sqlite")
    with TestClient(app) as client:
        for token in (None, "cnd-wrong"):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            assert client.post("/v1/chat/completions", content=chat(), headers=headers).status_code == 401
    rows = AuditLog(tmp_path / "audit.sqlite").read()
    assert [(row["outcome"], row["key_id"]) for row in rows] == [("unauthorized", None)] * 2
    assert "cnd-wrong" not in json.dumps(rows)
