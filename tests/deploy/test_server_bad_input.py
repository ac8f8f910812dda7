"""A battery of bad requests to the chat route: none gets a 500, each gets an OpenAI error object (or, where the
input is odd but usable, an answer), and each is recorded in the audit log under its request id."""

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from conductor.deploy import AuditLog, KeySpec, KeyStore, SpendLedger, create_app, hash_key, new_key
from tests.deploy.test_audit_exactly_once import call, part
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


CASES = [  # (name, body, the status its client gets, the outcome its audit row holds)
    ("malformed JSON", raw("{not json"), 400, "input"),
    ("truncated JSON", raw('{"messages": ['), 400, "input"),
    ("not UTF-8", b'\xff\xfe{"messages": 1}', 400, "input"),
    ("empty body", b"", 400, "input"),
    ("a JSON array", raw("[1, 2]"), 400, "input"),
    ("a JSON string", raw('"hello"'), 400, "input"),
    ("JSON null", raw("null"), 400, "input"),
    ("nested 30,000 deep", nested(30_000), 400, "input"),
    ("nested 500 objects deep in metadata", chat(metadata=json.loads('{"a":' * 500 + "1" + "}" * 500)), 400, "input"),
    ("nested one level too deep", nested(64), 400, "input"),
    ("nested as deep as allowed", nested(63), 200, "ok"),
    ("an integer of 5,000 digits", raw('{"messages": [], "max_tokens": ' + "9" * 5_000 + "}"), 400, "input"),
    ("a number too large for a float", chat()[:-1] + b', "temperature": 1e400}', 400, "input"),
    ("NaN in an ignored field", chat()[:-1] + b', "top_p": NaN}', 400, "input"),
    ("Infinity in an ignored field", chat()[:-1] + b', "seed": -Infinity}', 400, "input"),
    ("an integer of 4,000 digits in an ignored field", chat()[:-1] + b', "seed": ' + b"9" * 4_000 + b"}", 200, "ok"),
    ("no messages", raw('{"model": "team"}'), 400, "input"),
    ("empty messages", raw('{"messages": []}'), 400, "input"),
    ("messages a string", raw('{"messages": "hi"}'), 400, "input"),
    ("a message a string", raw('{"messages": ["hi"]}'), 400, "input"),
    ("a message without a role", raw('{"messages": [{"content": "hi"}]}'), 400, "input"),
    ("a role that is a number", raw('{"messages": [{"role": 5, "content": "hi"}]}'), 400, "input"),
    ("content a number", chat(42), 400, "input"),
    ("content parts that are numbers", chat([1, 2]), 400, "input"),
    ("an image content part", chat([{"type": "image_url", "image_url": {"url": "http://x"}}]), 400, "input"),
    ("a text part whose text is a number", chat([{"type": "text", "text": 5}]), 400, "input"),
    ("no user message", raw('{"messages": [{"role": "system", "content": "hi"}]}'), 400, "input"),
    ("null user content", chat(None), 400, "input"),
    ("a blank question", chat("   "), 400, "input"),
    ("a lone surrogate question", raw('{"messages": [{"role": "user", "content": "Say \\ud800 7."}]}'), 400, "input"),
    ("an over-long question", chat("Say the number 7. " * 200), 400, "input"),
    ("a body over the limit", chat("x" * (MAX_BYTES + 10)), 413, "input"),
    ("stream not a boolean", chat(stream="yes please"), 400, "input"),
    ("stream_options not an object", chat(stream=True, stream_options=3), 400, "input"),
    ("max_tokens a word", chat(max_tokens="many"), 400, "input"),
    ("max_tokens negative", chat(max_tokens=-5), 400, "input"),
    ("max_tokens a fraction", chat(max_tokens=1.5), 400, "input"),
    ("max_tokens zero", chat(max_completion_tokens=0), 400, "input"),
    ("max_tokens of 2**63", chat(max_tokens=2**63), 400, "input"),
    ("max_tokens of 4,000 digits", chat()[:-1] + b', "max_tokens": ' + b"9" * 4_000 + b"}", 400, "input"),
    ("max_tokens at the most allowed", chat(max_tokens=10**12, max_completion_tokens=10**12), 200, "ok"),
    ("max_tokens one past the most allowed", chat(max_completion_tokens=10**12 + 1), 400, "input"),
    ("temperature NaN", chat()[:-1] + b', "temperature": NaN}', 400, "input"),
    ("a NaN budget", chat()[:-1] + b', "conductor_budget": {"max_cost": NaN}}', 400, "input"),
    ("an infinite budget", chat()[:-1] + b', "conductor_budget": {"max_tokens": Infinity}}', 400, "input"),
    ("a max_cost of 1e300", chat(conductor_budget={"max_cost": 1e300}), 400, "input"),
    ("a max_steps of 10**20", chat(conductor_budget={"max_steps": 10**20}), 400, "input"),
    ("a budget at the most allowed", chat(conductor_budget={"max_cost": 10**6, "max_tokens": 10**12}), 200, "ok"),
    ("a budget that is a number", chat(conductor_budget=5), 400, "input"),
    ("a budget with an unknown field", chat(conductor_budget={"max_stepz": 1}), 400, "input"),
    ("a budget limit that is a word", chat(conductor_budget={"max_steps": "two"}), 400, "input"),
    ("a budget too small to answer", chat(conductor_budget={"max_tokens": 1}), 400, "budget"),
    ("model a number", raw('{"model": 5, "messages": [{"role": "user", "content": "hi"}]}'), 400, "input"),
    ("an unknown model", raw('{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'), 404, "input"),
    ("n of 5", chat(n=5), 400, "input"),
    ("response_format a string", chat(response_format="json"), 400, "input"),
    ("response_format json_object", chat(response_format={"type": "json_object"}), 400, "input"),
    ("tools", chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400, "input"),
    # Odd but usable: answered, and audited like any request.
    ("unknown fields at any depth", chat(frobnicate={"deep": [1, {"x": None}]}, logit_bias={"1": 2}), 200, "ok"),
    ("a lone surrogate in a field name", raw(chat().decode()[:-1] + ', "\\ud800": 1}'), 400, "input"),
    ("a lone surrogate in another field", raw(chat().decode()[:-1] + ', "user": "\\udc00"}'), 200, "ok"),
    ("a NUL in the question", chat("Say the number 7.\u0000"), 200, "ok"),
]
KEY = new_key()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server with a key, so every request goes through the spend ledger too; gives the client and its database."""
    db = tmp_path_factory.mktemp("bad-input") / "audit.sqlite"
    program = make_program()
    program.max_question_chars = MAX_QUESTION_CHARS
    keys = KeyStore([KeySpec(id="alice", hash=hash_key(KEY))])
    app = create_app(program, model="team", keys=keys, max_request_bytes=MAX_BYTES, audit_db=db)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, db


@pytest.mark.parametrize(
    "body, status, outcome", [pytest.param(body, status, outcome, id=name) for name, body, status, outcome in CASES]
)
def test_a_bad_request_gets_a_4xx_and_one_audit_row_with_its_outcome(server, request, body, status, outcome):
    client, db = server
    request_id = f"bad-{abs(hash(request.node.name)):x}"
    headers = {"content-type": "application/json", "x-request-id": request_id, "authorization": f"Bearer {KEY}"}
    response = client.post("/v1/chat/completions", content=body, headers=headers)
    assert response.status_code == status, response.text
    assert response.headers["x-request-id"] == request_id
    if status != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    [row] = [row for row in AuditLog(db).read() if row["request_id"] == request_id]
    assert row["outcome"] == outcome and (row["error"] is None) == (outcome == "ok")
    day = SpendLedger(db).day("alice")
    assert day.held_cost == day.held_tokens == 0  # nothing left reserved


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


@pytest.mark.parametrize("declared", ["²", "9" * 5_000, "-1", "lots"])
def test_a_content_length_that_is_no_usable_number_is_not_a_500(tmp_path, declared):
    db = tmp_path / "audit.sqlite"
    app = create_app(make_program(), model="team", audit_db=db)
    headers = [(b"content-length", declared.encode("latin-1")), (b"x-request-id", b"odd-length")]
    status, body = call(app, [part(chat(), more=False)], headers)  # "²" is a digit to str.isdigit, not to int
    assert status == 200, body
    [row] = AuditLog(db).read()
    assert (row["request_id"], row["outcome"]) == ("odd-length", "ok")
