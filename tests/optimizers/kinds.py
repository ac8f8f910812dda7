"""Three kinds of question over three scripted workers, each kind answered right only by its own workflow (one of
them two steps): the pool of the learning test and of the program-search tests.

Worker ``reverse`` reverses the quoted word of the task, ``add`` adds its two numbers, ``shout`` writes the latest
earlier answer it is shown in capitals (alone it has none, and says so):

- "Spell 'cat' backwards." : a last step on ``reverse``;
- "Add 3 and 5." : a last step on ``add`` (or ``add`` then ``shout``: capitals change no digit);
- "Shout 'cat' backwards, in capitals." : two steps, ``reverse`` then ``shout`` seeing step 0.
"""

from __future__ import annotations

import re

import dspy

from conductor.testing import ScriptedWorker

WORDS = ["cat", "dog", "sun", "tree", "fish", "bird", "lamp", "rock", "moon", "star", "leaf", "wolf"]
FAMILIES = {
    "spell": (lambda i: f"Spell '{WORDS[i]}' backwards.", lambda i: WORDS[i][::-1]),
    "add": (lambda i: f"Add {i + 3} and {2 * i + 5}.", lambda i: str(3 * i + 8)),
    "shout": (lambda i: f"Shout '{WORDS[i]}' backwards, in capitals.", lambda i: WORDS[i][::-1].upper()),
}


def task(prompt: str) -> str:
    """The overall task in a worker prompt, without the earlier steps or the conductor's subtask."""
    return prompt.split("Your subtask")[0].split("response:")[0]


def reverse(prompt: str) -> str:
    match = re.search(r"'(\w+)'", task(prompt))
    return match[1][::-1] if match else "I can't do that."


def add(prompt: str) -> str:
    match = re.search(r"Add (\d+) and (\d+)", task(prompt))
    return str(int(match[1]) + int(match[2])) if match else "I can't do that."


def shout(prompt: str) -> str:
    earlier = re.findall(r"response:\n(.*)", prompt)
    return earlier[-1].strip().upper() if earlier else "I have nothing to shout."


def workers() -> list[ScriptedWorker]:
    return [ScriptedWorker("reverse", reverse), ScriptedWorker("add", add), ScriptedWorker("shout", shout)]


def example(family: str, i: int, *, labelled: bool = True) -> dspy.Example:
    """Question ``i`` of ``family``; ``labelled=False`` leaves out the ``family`` field."""
    question, answer = FAMILIES[family]
    fields = {"question": question(i), "answer": answer(i)}
    return dspy.Example(**fields, **({"family": family} if labelled else {})).with_inputs("question")


def right(example: dspy.Example, prediction: dspy.Prediction) -> bool:
    return prediction.answer == example.answer
