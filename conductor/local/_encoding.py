"""The one encoding of chat messages into prompt token ids, shared by local workers, the conductor LM and GRPO.

Messages are OpenAI-style: ``system`` and ``developer`` messages become the system prompt, ``assistant`` stays
``assistant``, every other role (``user``, tool results) is a user turn. A tokenizer with a chat template renders
them with it (with the generation prompt). Without one (Gemma-3-270M is a base model) they are plain text::

    {system}

    Question: {user turn}

    Answer: {assistant turn}

    Question: {last user turn}

    Answer:

and generation also stops at ``PLAIN_STOP``, where the model starts a new ``Question:`` of its own, which a base model
otherwise does until ``max_tokens`` runs out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dspy.lm15 import Request

Prompt = str | Sequence[Mapping[str, str]] | Sequence[int]
"""Raw text that the model continues as is (no special tokens added), OpenAI-style chat messages, or token ids."""

_PLAIN_USER = "Question: "
_PLAIN_ASSISTANT = "Answer:"
PLAIN_STOP = "\n\n" + _PLAIN_USER.rstrip()
_SYSTEM_ROLES = ("system", "developer")


def request_messages(request: Request) -> list[dict[str, str]]:
    """OpenAI-style messages of a DSPy request: its system prompt first, then its turns."""
    messages = [{"role": "system", "content": _text(request.system)}] if request.system else []
    messages += [{"role": m.role, "content": m.text or ""} for m in request.messages]
    return messages


def _text(content: Any) -> str:
    """A system prompt as text: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") or "" for part in content)


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Token ids of a prompt: raw text as is, chat messages as the module docstring says, token ids unchanged."""
    if isinstance(prompt, str):
        return tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if prompt and isinstance(prompt[0], int):
        return list(prompt)
    system = "\n\n".join(m["content"] for m in prompt if m["role"] in _SYSTEM_ROLES) or None
    turns = [
        ("assistant" if m["role"] == "assistant" else "user", m["content"])
        for m in prompt
        if m["role"] not in _SYSTEM_ROLES
    ]
    if has_chat_template(tokenizer):
        messages = [{"role": "system", "content": system}] if system else []
        messages += [{"role": role, "content": text} for role, text in turns]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    parts = [system] if system else []
    parts += [_PLAIN_USER + text if role == "user" else f"{_PLAIN_ASSISTANT} {text}" for role, text in turns]
    return list(tokenizer("\n\n".join([*parts, _PLAIN_ASSISTANT]))["input_ids"])


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))
