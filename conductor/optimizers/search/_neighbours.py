"""Which training questions are alike: each question's nearest ones by the words they share, weighted by how rare
each word is (TF-IDF cosine similarity).

The search scores one sample per question, so a question's own winner is partly luck: on a kind of question where
every candidate is near chance, the candidates right on it differ question by question. Pooling each question's
outcomes with those of the questions most like it teaches one workflow to a kind of question, and still tells kinds
apart whose wording differs. Hand-written: twenty lines of word counting, where scikit-learn's ``TfidfVectorizer``
would add a large dependency for it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

_WORD = re.compile(r"\w+")


def nearest(texts: Sequence[str], k: int) -> list[tuple[int, ...]]:
    """For each text, the indices of the ``k`` texts most like it, itself first, then by similarity (ties by index)."""
    counts = [Counter(_WORD.findall(text.lower())) for text in texts]
    documents = Counter(word for count in counts for word in count)
    idf = {word: math.log((1 + len(texts)) / (1 + n)) + 1 for word, n in documents.items()}
    vectors = [{word: n * idf[word] for word, n in count.items()} for count in counts]
    norms = [math.sqrt(sum(v * v for v in vector.values())) or 1.0 for vector in vectors]

    def similarity(i: int, j: int) -> float:
        small, large = sorted((vectors[i], vectors[j]), key=len)
        return sum(v * large.get(word, 0.0) for word, v in small.items()) / (norms[i] * norms[j])

    return [
        (i, *sorted((j for j in range(len(texts)) if j != i), key=lambda j: (-similarity(i, j), j))[: k - 1])
        for i in range(len(texts))
    ]
