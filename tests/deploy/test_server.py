import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from conductor.cli import _common, _serve, main
from conductor.deploy import KeySpec, KeyStore, create_app, hash_key, new_key, save_program
from conductor.modules import Budget, Conductor, WorkerPool
from conductor.testing import ScriptedWorker, scripted_lm
from tests.deploy.helpers import compiled_program
from tests.deploy.test_governance import PricedWorker

TWO_STEPS = 'model_id = [0, 1]\nsubtasks = ["plan it", "solve it"]\naccess_list = [[], "all"]'


def echo_number(prompt: str) -> str:
    """The solver answers with the number in the question, so each request's answer is its own."""
    number = re.search(r"number (\d+)", prompt).group(1)
    return f"Done.\nAnswer: {number}"


def make_program(*, delay_s: float = 0.0, budget: Budget = Budget(), conductor=None) -> Conductor:
    pool = WorkerPool(
        [ScriptedWorker("planner", lambda _: "1. look"), ScriptedWorker("solver", echo_number, delay_s=delay_s)]
    )
    return Conductor(pool, conductor or scripted_lm(lambda _: TWO_STEPS), budget=budget)


@pytest.fixture
def serve():
    clients = []

    def start(program: Conductor | None = None, **options) -> TestClient:
        client = TestClient(create_app(program or make_program(), model="tiny-team", **options))
        clients.append(client.__enter__())
        return client

    yield start
    for client in clients:
        client.__exit__(None, None, None)


def ask(client: TestClient, question: str = "Say the number 7.", model: str = "tiny-team", **extra):
    return client.post(
        "/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": question}], **extra}
    )


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_a_question_gets_a_chat_completion_with_the_conductor_s_trace(serve):
    body = ask(serve()).json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == "tiny-team"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "7"}, "finish_reason": "stop"}]
    conductor = body["conductor"]
    assert [step["worker"] for step in conductor["steps"]] == ["planner", "solver"]
    assert {"subtask", "prompt_tokens", "completion_tokens", "cost", "latency_s", "error"} <= set(conductor["steps"][0])
    assert conductor["workflow"].startswith("model_id = [0, 1]") and conductor["error"] is None
    usage, own = body["usage"], conductor["conductor_usage"]  # usage counts the conductor LM's own call too
    assert own["prompt_tokens"] > 0 and own["completion_tokens"] > 0
    for part in ("prompt_tokens", "completion_tokens"):
        assert usage[part] == own[part] + sum(step[part] for step in conductor["steps"])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] == conductor["tokens"]


def test_the_question_is_the_last_user_message_text_parts_included(serve):
    client = serve()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say the number 1."},
        {"role": "assistant", "content": "1"},
        {"role": "user", "content": [{"type": "text", "text": "Say the"}, {"type": "text", "text": "number 8."}]},
    ]
    response = client.post("/v1/chat/completions", json={"messages": messages})
    assert response.json()["choices"][0]["message"]["content"] == "8"


def test_a_program_with_several_inputs_takes_a_json_object(serve):
    pool = WorkerPool([ScriptedWorker("planner", lambda _: "1. look"), ScriptedWorker("solver", echo_number)])
    client = serve(Conductor(pool, scripted_lm(lambda _: TWO_STEPS), signature="topic, question -> answer"))
    good = ask(client, json.dumps({"topic": "counting", "question": "Say the number 5."}))
    assert good.json()["choices"][0]["message"]["content"] == "5"
    error = error_of(ask(client, "Say the number 5."), 400)
    assert "this program takes ['topic', 'question']" in error["message"]
    too_deep = '{"topic": "counting", "question": ' + "[" * 100 + "]" * 100 + "}"
    error = error_of(ask(client, too_deep), 400)
    assert "(the question nests arrays and objects more than 64 levels deep)" in error["message"]


def test_models_and_health(serve):
    client = serve()
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["tiny-team"]
    assert client.get("/health").json() == {"status": "ok", "model": "tiny-team", "workers": ["planner", "solver"]}


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"model": "x"}', "messages: Field required"),
        (b'{"messages": []}', "messages: List should have at least 1 item"),
        (b'{"messages": [{"role": "system", "content": "hi"}]}', "no user message"),
        (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "only text content"),
        (b'{"messages": [{"role": "user", "content": "  "}]}', "the question is empty"),
    ],
)
def test_malformed_requests_get_a_400_with_a_clear_message(serve, body, message):
    response = serve().post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    error = error_of(response, 400)
    assert message in error["message"] and error["type"] == "invalid_request_error"


def test_a_body_over_the_limit_gets_a_413_and_runs_nothing(serve):
    program = make_program()
    client = serve(program, max_request_bytes=1_000)
    error = error_of(ask(client, "Say the number 7. " + "x" * 2_000), 413)
    assert error["code"] == "request_too_large" and "1,000 bytes" in error["message"]
    assert program.pool[0].calls == 0
    assert ask(client).status_code == 200


def test_a_slow_run_gets_a_504(serve):
    error = error_of(ask(serve(make_program(delay_s=2.0), request_timeout_s=0.2)), 504)
    assert error["code"] == "timeout" and "0.2 s" in error["message"]


def test_a_request_may_lower_the_budget_but_not_raise_it(serve):
    program = make_program(budget=Budget(max_steps=5, max_tokens=10_000))
    client = serve(program, budget=Budget(max_steps=2, max_tokens=10_000))

    lowered = ask(client, conductor_budget={"max_steps": 1})
    assert error_of(lowered, 400)["code"] == "budget_exceeded"  # one step of two: no answer
    conductor = lowered.json()["conductor"]
    assert conductor["error"]["kind"] == "budget" and len(conductor["steps"]) == 1
    assert conductor["budget"]["max_steps"] == 1

    raised = ask(client, conductor_budget={"max_steps": 50, "max_tokens": 10**9}).json()
    assert raised["conductor"]["budget"] == {
        "max_steps": 2,
        "max_tokens": 10_000,
        "max_cost": None,
        "max_tokens_per_step": None,
    }
    assert raised["conductor"]["error"] is None
    assert program.executor.budget == Budget(max_steps=5, max_tokens=10_000)  # the program's own is untouched


@pytest.mark.parametrize(
    "budget, message",
    [
        ({"max_step": 1}, "unknown fields ['max_step']"),
        ({"max_cost": -1}, "conductor_budget.max_cost: must be from 0 to 1,000,000"),
        ({"max_tokens": 10**12 + 1}, "conductor_budget.max_tokens: must be from 0 to 1,000,000,000,000"),
    ],
)
def test_a_bad_budget_gets_a_400_naming_the_allowed_range(serve, budget, message):
    assert message in error_of(ask(serve(), conductor_budget=budget), 400)["message"]


@pytest.mark.parametrize(
    "limit, message",
    [
        ('{"max_cost": NaN}', "NaN is not a JSON value"),
        ('{"max_cost": Infinity}', "Infinity is not a JSON value"),
        ('{"max_tokens": -Infinity}', "-Infinity is not a JSON value"),
        ('{"max_cost": 1e400}', "the number 1e400 is too large for a 64-bit float"),
    ],
)
def test_a_nan_or_infinite_number_gets_a_400_not_a_500(serve, limit, message):
    body = '{"messages": [{"role": "user", "content": "Say the number 7."}], "conductor_budget": ' + limit + "}"
    response = serve().post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    error = error_of(response, 400)
    assert error["message"].startswith("the request body is not valid JSON") and message in error["message"]


def test_a_per_step_limit_of_zero_is_zero_not_unlimited(serve):
    response = ask(serve(budget=Budget(max_tokens_per_step=16)), conductor_budget={"max_tokens_per_step": 0})
    assert error_of(response, 400)["code"] == "budget_exceeded"
    body = response.json()
    assert body["conductor"]["budget"]["max_tokens_per_step"] == 0
    assert body["conductor"]["error"]["kind"] == "budget" and body["conductor"]["steps"] == []


def test_parallel_requests_all_get_their_own_answer(serve):
    client = serve(make_program(delay_s=0.01), concurrency=4)
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda i: ask(client, f"Say the number {i}."), range(40)))
    assert [r.status_code for r in responses] == [200] * 40
    assert [r.json()["choices"][0]["message"]["content"] for r in responses] == [str(i) for i in range(40)]


def test_a_failing_conductor_lm_gets_a_502_and_a_bug_a_500(serve):
    def broken(_):
        raise RuntimeError("the conductor is down")

    error = error_of(ask(serve(make_program(conductor=scripted_lm(broken)))), 502)
    assert "the conductor is down" in error["message"] and error["type"] == "server_error"

    program = make_program()

    async def a_bug(*args, **kwargs):
        return 1 / 0  # a bug in the library

    program.arun_reply = a_bug
    error = error_of(ask(serve(program)), 500)
    assert error["code"] == "internal_error" and "ZeroDivisionError" in error["message"]


def test_a_saved_program_is_served_by_the_cli(tmp_path, monkeypatch):
    import uvicorn

    folder = save_program(compiled_program(), tmp_path / "math-team")
    served = {}

    def serve_without_listening(server: uvicorn.Server, sockets=None) -> None:
        served.update(app=server.config.app, host=server.config.host, port=sockets[0].getsockname()[1])

    monkeypatch.setattr(uvicorn.Server, "run", serve_without_listening)
    monkeypatch.setattr(_serve, "tune_gc_for_serving", lambda: None)  # process-wide (tests/cli/test_cli.py checks it)
    assert main(["serve", str(folder), "--port", "0", "--timeout", "5", "--trust-code"]) == 0
    assert served["host"] == "127.0.0.1" and served["port"] > 0
    with TestClient(served["app"]) as client:
        body = ask(client, "What is 17 * 23 + 4?", model="math-team").json()
    assert body["model"] == "math-team" and body["choices"][0]["message"]["content"] == "395"


def test_the_cli_names_a_folder_that_is_not_a_program(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(_common.status, "width", 300)  # no wrapping inside the message
    assert main(["serve", str(tmp_path / "nothing")]) == 2
    assert "nothing is not a folder: there is no saved program there" in capsys.readouterr().err


def test_the_core_package_imports_without_fastapi():
    code = (
        "import sys; sys.modules['fastapi'] = None\n"
        "import conductor.deploy, conductor.cli\n"
        "from conductor import MissingDependency\n"
        "try:\n    conductor.deploy.create_app(None)\n"
        "except MissingDependency as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'dspy-conductor[serve]'" in out


# ---- the OpenAI protocol ----------------------------------------------------------------------------------------
def sse_events(response) -> list:
    """The ``data:`` payloads of a server-sent-event body, JSON-decoded but the final ``[DONE]``."""
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    lines = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("include_usage", [False, True])
def test_stream_true_answers_with_chunks_then_done(serve, include_usage):
    options = {"stream_options": {"include_usage": True}} if include_usage else {}
    response = ask(serve(), "Say the number 5.", stream=True, **options)
    chunks = sse_events(response)
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    choices = [chunk["choices"][0] for chunk in chunks if chunk["choices"]]
    assert choices[0]["delta"]["role"] == "assistant"
    assert "".join(choice["delta"].get("content", "") for choice in choices) == "5"
    assert [choice["finish_reason"] for choice in choices] == [None, None, "stop"]
    assert [step["worker"] for step in chunks[len(choices) - 1]["conductor"]["steps"]] == ["planner", "solver"]
    if include_usage:
        last = chunks[-1]
        assert last["choices"] == [] and last["usage"]["total_tokens"] == chunks[2]["conductor"]["tokens"] > 0
        assert all(chunk["usage"] is None for chunk in chunks[:-1])
    else:
        assert all("usage" not in chunk for chunk in chunks)
    assert float(response.headers["x-conductor-cost-usd"]) == 0.0


def test_an_unknown_model_gets_a_404_and_the_models_route_lists_the_one_model(serve):
    client = serve()
    error = error_of(ask(client, model="gpt-4o"), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model" and "'tiny-team'" in error["message"]
    assert client.get("/v1/models").json() == {
        "object": "list",
        "data": [{"id": "tiny-team", "object": "model", "created": 0, "owned_by": "dspy-conductor"}],
    }
    assert client.get("/v1/models/tiny-team").json()["id"] == "tiny-team"
    assert error_of(client.get("/v1/models/gpt-4o"), 404)["code"] == "model_not_found"
    assert ask(client, model=None).status_code == 200  # no model named: the one served


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"n": 2}, "n"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"temperature": 3}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_parameters_the_program_cannot_honour_get_a_400_naming_them(serve, extra, param):
    program = make_program()
    error = error_of(ask(serve(program), **extra), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert program.pool[0].calls == 0


def test_n_1_temperature_and_a_text_response_format_are_accepted(serve):
    response = ask(serve(), n=1, temperature=0.2, response_format={"type": "text"}, top_p=0.9, seed=3, user="u")
    assert response.json()["choices"][0]["message"]["content"] == "7"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_lowers_the_run_s_token_budget_and_never_raises_it(serve, field):
    client = serve(budget=Budget(max_tokens=10_000))
    assert ask(client, **{field: 5_000}).json()["conductor"]["budget"]["max_tokens"] == 5_000
    assert ask(client, **{field: 10**9}).json()["conductor"]["budget"]["max_tokens"] == 10_000
    too_few = error_of(ask(client, **{field: 50}), 400)
    assert too_few["code"] == "budget_exceeded" and "budget" in too_few["message"]


def test_every_response_has_a_request_id_the_client_s_when_usable(serve):
    client = serve()
    assert ask(client).headers["x-request-id"].startswith("req-")
    echoed = client.get("/v1/models", headers={"x-request-id": "trace-42:a.b"})
    assert echoed.headers["x-request-id"] == "trace-42:a.b"
    replaced = client.get("/health", headers={"x-request-id": "bad id\twith spaces"})
    assert replaced.headers["x-request-id"].startswith("req-")
    assert client.get("/nowhere").headers["x-request-id"].startswith("req-")


def test_a_run_s_cost_is_in_a_header(serve):
    pool = WorkerPool([PricedWorker("planner", 0.002), PricedWorker("solver", 0.001)])
    response = ask(serve(Conductor(pool, scripted_lm(lambda _: TWO_STEPS))))
    assert float(response.headers["x-conductor-cost-usd"]) == pytest.approx(0.003)
    assert response.json()["conductor"]["cost"] == pytest.approx(0.003)


@pytest.mark.parametrize(
    "method, path, status, code",
    [
        ("GET", "/v2/anything", 404, "not_found"),
        ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
        ("DELETE", "/v1/models", 405, "method_not_allowed"),
        ("POST", "/health", 405, "method_not_allowed"),
    ],
)
def test_unknown_routes_and_wrong_methods_get_openai_errors(serve, method, path, status, code):
    error = error_of(serve().request(method, path), status)
    assert error["code"] == code and path in error["message"] and "POST /v1/chat/completions" in error["message"]


def test_an_unexpected_error_on_any_route_is_an_openai_500_with_a_request_id():
    app = create_app(make_program(), model="tiny-team")
    app.get("/boom")(lambda: 1 / 0)  # a route with a bug
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.get("/boom", headers={"x-request-id": "boom-1"})
    error = error_of(response, 500)
    assert error["code"] == "internal_error" and "ZeroDivisionError" in error["message"]
    assert response.headers["x-request-id"] == "boom-1"


def test_the_docs_are_off_unless_asked_for_and_then_need_a_key():
    key = new_key()
    keys, authorized = KeyStore([KeySpec(id="alice", hash=hash_key(key))]), {"Authorization": f"Bearer {key}"}
    pages = ("/docs", "/redoc", "/openapi.json")
    with TestClient(create_app(make_program(), keys=keys)) as client:
        assert [client.get(page, headers=authorized).status_code for page in pages] == [404] * 3
    with TestClient(create_app(make_program(), keys=keys, docs=True)) as client:
        assert [error_of(client.get(page), 401)["code"] for page in pages] == ["missing_api_key"] * 3
        docs, redoc, schema = (client.get(page, headers=authorized) for page in pages)
    assert "swagger-ui" in docs.text and "redoc" in redoc.text and "/v1/chat/completions" in schema.json()["paths"]
    assert "/docs" not in schema.json()["paths"]
