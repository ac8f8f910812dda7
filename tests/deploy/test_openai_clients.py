"""The official ``openai`` SDK and LiteLLM's client against a served program (uvicorn on a free localhost port)."""

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
import openai

from conductor.deploy import KeySpec, KeyStore, create_app, hash_key, new_key
from tests.deploy.helpers import running
from tests.deploy.test_server import make_program

KEY = new_key()
SOLVER_ONLY_KEY = new_key()


@pytest.fixture(scope="module")
def base_url():
    """A server over the scripted two-step team, with a key for everything and one for the solver alone."""
    keys = KeyStore(
        [
            KeySpec(id="all", hash=hash_key(KEY)),
            KeySpec(id="solver-only", hash=hash_key(SOLVER_ONLY_KEY), workers=("solver",)),
        ]
    )
    with running(create_app(make_program(), model="team", keys=keys)) as url:
        yield url


def client(base_url: str, key: str = KEY) -> "openai.OpenAI":
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30)


def ask(**options):
    return {"model": "team", "messages": [{"role": "user", "content": "Say the number 7."}], **options}


def test_a_completion(base_url):
    raw = client(base_url).chat.completions.with_raw_response.create(**ask())
    completion = raw.parse()
    assert completion.choices[0].message.content == "7" and completion.choices[0].finish_reason == "stop"
    assert completion.model == "team" and completion.usage.total_tokens > 0
    assert raw.headers["x-request-id"] and float(raw.headers["x-conductor-cost-usd"]) == 0.0
    trace = completion.model_extra["conductor"]  # the SDK keeps the extra field
    assert completion.usage.total_tokens == trace["tokens"] > trace["conductor_usage"]["prompt_tokens"] > 0


def test_a_stream_with_usage(base_url):
    chunks = list(client(base_url).chat.completions.create(**ask(stream=True, stream_options={"include_usage": True})))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == "7"
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0


def test_the_models_list(base_url):
    assert [model.id for model in client(base_url).models.list()] == ["team"]
    assert client(base_url).models.retrieve("team").id == "team"


def test_an_unknown_model_is_not_found(base_url):
    with pytest.raises(openai.NotFoundError) as caught:
        client(base_url).chat.completions.create(**ask(model="gpt-4o"))
    assert caught.value.code == "model_not_found" and caught.value.param == "model"


def test_a_wrong_key_is_unauthenticated_and_a_forbidden_worker_is_denied(base_url):
    with pytest.raises(openai.AuthenticationError) as caught:
        client(base_url, "cnd-wrong").chat.completions.create(**ask())
    assert caught.value.code == "invalid_api_key"
    with pytest.raises(openai.PermissionDeniedError) as caught:  # the workflow asks the planner too
        client(base_url, SOLVER_ONLY_KEY).chat.completions.create(**ask())
    assert caught.value.code == "worker_forbidden" and "planner" in caught.value.message


def test_refused_parameters_and_a_budget_too_small_are_bad_requests(base_url):
    for options in ({"n": 3}, {"response_format": {"type": "json_object"}}, {"max_tokens": 20}):
        with pytest.raises(openai.BadRequestError):
            client(base_url).chat.completions.create(**ask(**options))
    with pytest.raises(openai.BadRequestError) as caught:
        client(base_url).chat.completions.create(**ask(max_completion_tokens=20))
    assert caught.value.code == "budget_exceeded"


def test_litellm_s_client(base_url):
    litellm = pytest.importorskip("litellm")
    options = {"model": "openai/team", "api_base": base_url, "api_key": KEY, "num_retries": 0}
    messages = [{"role": "user", "content": "Say the number 7."}]
    response = litellm.completion(messages=messages, **options)
    assert response.choices[0].message.content == "7" and response.usage.total_tokens > 0
    streamed = litellm.completion(messages=messages, stream=True, **options)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed) == "7"
    with pytest.raises(litellm.NotFoundError):
        litellm.completion(messages=messages, **(options | {"model": "openai/gpt-4o"}))
