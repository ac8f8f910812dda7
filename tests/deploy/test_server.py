import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from conductor.cli import _common, main
from conductor.deploy import create_app, save_program
from conductor.modules import Budget, Conductor, WorkerPool
from conductor.testing import ScriptedWorker, scripted_lm
from tests.deploy.helpers import compiled_program

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


def ask(client: TestClient, question: str = "Say the number 7.", **extra):
    return client.post(
        "/v1/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": question}], **extra}
    )


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code"}
    return error


def test_a_question_gets_a_chat_completion_with_the_conductor_s_trace(serve):
    body = ask(serve()).json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == "tiny-team"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "7"}, "finish_reason": "stop"}]
    conductor = body["conductor"]
    assert [step["worker"] for step in conductor["steps"]] == ["planner", "solver"]
    assert {"subtask", "prompt_tokens", "completion_tokens", "cost", "latency_s", "error"} <= set(conductor["steps"][0])
    assert conductor["workflow"].startswith("model_id = [0, 1]") and conductor["error"] is None
    usage = body["usage"]
    assert usage["prompt_tokens"] == sum(step["prompt_tokens"] for step in conductor["steps"]) > 0
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
        (b'{"messages": [{"role": "user", "content": "q"}], "stream": true}', "streaming is not supported"),
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

    lowered = ask(client, conductor_budget={"max_steps": 1}).json()
    assert lowered["choices"][0]["finish_reason"] == "length"
    assert lowered["conductor"]["error"]["kind"] == "budget" and len(lowered["conductor"]["steps"]) == 1
    assert lowered["conductor"]["budget"]["max_steps"] == 1

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
    "budget, message", [({"max_step": 1}, "unknown fields ['max_step']"), ({"max_cost": -1}, "must not be negative")]
)
def test_a_bad_budget_gets_a_400(serve, budget, message):
    assert message in error_of(ask(serve(), conductor_budget=budget), 400)["message"]


@pytest.mark.parametrize("limit", ['{"max_cost": NaN}', '{"max_cost": Infinity}', '{"max_tokens": -Infinity}'])
def test_a_nan_or_infinite_budget_gets_a_400_not_a_500(serve, limit):
    body = '{"messages": [{"role": "user", "content": "Say the number 7."}], "conductor_budget": ' + limit + "}"
    response = serve().post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert "invalid conductor_budget" in error_of(response, 400)["message"]


def test_a_per_step_limit_of_zero_is_zero_not_unlimited(serve):
    body = ask(serve(budget=Budget(max_tokens_per_step=16)), conductor_budget={"max_tokens_per_step": 0}).json()
    assert body["conductor"]["budget"]["max_tokens_per_step"] == 0
    assert body["conductor"]["error"]["kind"] == "budget" and body["conductor"]["steps"] == []


def test_parallel_requests_all_get_their_own_answer(serve):
    client = serve(make_program(delay_s=0.01), concurrency=4)
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda i: ask(client, f"Say the number {i}."), range(40)))
    assert [r.status_code for r in responses] == [200] * 40
    assert [r.json()["choices"][0]["message"]["content"] for r in responses] == [str(i) for i in range(40)]


def test_a_failing_program_gets_a_500(serve):
    def broken(_):
        raise RuntimeError("the conductor is down")

    error = error_of(ask(serve(make_program(conductor=scripted_lm(broken)))), 500)
    assert "the conductor is down" in error["message"] and error["type"] == "server_error"


def test_a_saved_program_is_served_by_the_cli(tmp_path, monkeypatch):
    import uvicorn

    folder = save_program(compiled_program(), tmp_path / "math-team")
    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: served.update(app=app, **options))
    assert main(["serve", str(folder), "--port", "9123", "--timeout", "5", "--trust-code"]) == 0
    assert served["host"] == "127.0.0.1" and served["port"] == 9123
    with TestClient(served["app"]) as client:
        body = ask(client, "What is 17 * 23 + 4?").json()
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
