import hashlib
import sqlite3

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from conductor.deploy import AuditEntry, AuditLog, KeySpec, KeyStore, create_app, hash_key, new_key
from conductor.modules import Conductor, WorkerPool
from conductor.testing import ScriptedWorker, scripted_lm
from tests.deploy.helpers import POOL_CONFIG
from tests.deploy.test_governance import TWO_STEPS, PricedWorker

PROVIDER_ENV = "CONDUCTOR_TEST_PROVIDER_KEY"


def test_the_audit_log_refuses_updates_and_deletes(tmp_path):
    log = AuditLog(tmp_path / "audit.sqlite")
    log.write(AuditEntry("req-1", "team", "ok", key_id="alice", cost=0.5))
    with sqlite3.connect(tmp_path / "audit.sqlite") as db:
        for statement in ("UPDATE audit SET cost = 0", "DELETE FROM audit"):
            with pytest.raises(sqlite3.DatabaseError, match="the audit log is append-only"):
                db.execute(statement)
    assert [(r["request_id"], r["cost"]) for r in log.read()] == [("req-1", 0.5)]


def test_sensitive_fields_and_secret_values_are_redacted_at_any_depth(tmp_path):
    log = AuditLog(tmp_path / "audit.sqlite", sensitive_fields=["Session"], secrets=["s3cret-value", "pin"])
    request = {
        "api_key": "anything",
        "metadata": {"X-Api-Key": "k", "session": "abc", "note": "use s3cret-value now", "list": ["pin", "spin"]},
        "user": "bob",
        "max_tokens": 5,
    }
    assert log.redact(request) == {
        "api_key": "[REDACTED]",
        "metadata": {
            "X-Api-Key": "[REDACTED]",
            "session": "[REDACTED]",
            "note": "use [REDACTED] now",
            "list": [
                "[REDACTED]",
                "spin",  # a short secret is redacted only as a whole value
            ],
        },
        "user": "bob",
        "max_tokens": 5,
    }


def test_questions_are_kept_as_a_hash_unless_asked(tmp_path):
    for store, expected in ((False, None), (True, "What is 2 + 2?")):
        log = AuditLog(tmp_path / f"{store}.sqlite", store_questions=store)
        log.write(AuditEntry("req", "team", "ok", question="What is 2 + 2?"))
        [record] = log.read()
        assert record["question"] == expected
        assert record["question_sha256"] == hashlib.sha256(b"What is 2 + 2?").hexdigest()


def test_every_response_and_audit_record_carries_the_cost_by_step_and_by_worker(tmp_path):
    pool = WorkerPool([PricedWorker("planner", 0.002), PricedWorker("solver", 0.001)])
    program = Conductor(pool, scripted_lm(lambda _: TWO_STEPS))
    with TestClient(create_app(program, audit_db=tmp_path / "audit.sqlite")) as client:
        response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})
    body = response.json()
    conductor = body["conductor"]
    assert conductor["cost_by_step"] == {"0": 0.002, "1": 0.001}
    assert conductor["cost_by_worker"] == {"planner": 0.002, "solver": 0.001}
    assert conductor["cost"] == pytest.approx(0.003)
    [record] = AuditLog(tmp_path / "audit.sqlite").read()
    assert (
        record["request_id"] == response.headers["x-request-id"]
        and record["key_id"] is None
        and record["program"] == "dspy-conductor"
    )
    assert (record["cost_by_step"], record["cost_by_worker"]) == (
        conductor["cost_by_step"],
        conductor["cost_by_worker"],
    )
    assert record["workers"] == ["planner", "solver"] and record["outcome"] == "ok"
    assert record["prompt_tokens"] + record["completion_tokens"] == conductor["tokens"] and record["latency_s"] > 0


def test_the_audit_log_holds_no_api_key_or_secret_after_a_run(tmp_path, monkeypatch):
    provider_secret = "sk-provider-" + "9" * 24
    monkeypatch.setenv(PROVIDER_ENV, provider_secret)
    key = new_key()
    remote = {"name": "remote", "kind": "lm", "model": "openai/gpt-4o-mini", "api_key_env": PROVIDER_ENV}
    pool = WorkerPool.from_config({"workers": [*POOL_CONFIG["workers"], remote]})
    question = f"Log in with {key} and {provider_secret}, then say hi."
    workflow = f'model_id = [0]\nsubtasks = ["{question}"]\naccess_list = [[]]'  # the conductor copies the secrets
    program = Conductor(pool, scripted_lm(lambda _: workflow), fallback="none")
    keys = KeyStore([KeySpec(id="alice", hash=hash_key(key))])
    db = tmp_path / "audit.sqlite"
    app = create_app(program, keys=keys, audit_db=db, audit_questions=True, sensitive_fields=["session"])
    body = {
        "messages": [{"role": "user", "content": question}],
        "api_key": key,
        "user": "alice@example.com",
        "metadata": {"authorization": f"Bearer {key}", "note": provider_secret, "session": "sess-0123456789"},
    }
    with TestClient(app) as client:
        for _ in range(2):
            response = client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            assert response.status_code == 200, response.text

    stored = b"".join(path.read_bytes() for path in tmp_path.glob("audit.sqlite*"))
    for secret in (key, provider_secret, "sess-0123456789"):
        assert secret.encode() not in stored
    assert b"[REDACTED]" in stored and b"alice@example.com" in stored  # redacted, not dropped
    [record, _] = AuditLog(db).read()
    assert record["question"] == "Log in with [REDACTED] and [REDACTED], then say hi."
    assert record["request"]["metadata"] == {
        "authorization": "[REDACTED]",
        "note": "[REDACTED]",
        "session": "[REDACTED]",
    }


def test_an_unusable_workflow_and_an_empty_question_are_audited_with_their_outcome(tmp_path):
    program = Conductor(WorkerPool([ScriptedWorker("solo")]), scripted_lm(lambda _: "no lists"), fallback="none")
    with TestClient(create_app(program, audit_db=tmp_path / "audit.sqlite")) as client:
        for question in ("Hi", " "):
            client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": question}]})
    unusable, empty = AuditLog(tmp_path / "audit.sqlite").read()
    assert unusable["outcome"] == "format" and "model_id" in unusable["error"] and unusable["workflow"] is None
    assert empty["outcome"] == "input" and empty["error"] == "input error: the question is empty"
