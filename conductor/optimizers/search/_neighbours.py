"""Which training questions are alike: each question's nearest ones by the words they share, weighted by how rare
each word is (TF-IDF cosine similarity).

The search scores one sample per question, so a question's own winner is partly luck: on a kind of question where
every candidate is near chance, the candidates right on it differ question by question. Pooling each question's
outcomes with those of the questions most like it, weighted by how alike they are, teaches one workflow to a kind of
question, and still tells kinds apart whose wording differs: a question unlike its neighbours keeps its own winner.
Hand-written: twenty lines of word counting, where scikit-learn's ``TfidfVectorizer`` would add a large dependency.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

_WORD = re.compile(r"\w+")


def nearest(texts: Sequence[str], k: int) -> list[tuple[tuple[int, float], ...]]:
    """For each text, the ``k`` texts most like it as ``(index, similarity)``: itself first (similarity 1), then by
    similarity in [0, 1] (ties by index)."""
    counts = [Counter(_WORD.findall(text.lower())) for text in texts]
    documents = Counter(word for count in counts for word in count)
    idf = {word: math.log((1 + len(texts)) / (1 + n)) + 1 for word, n in documents.items()}
    vectors = [{word: n * idf[word] for word, n in count.items()} for count in counts]
    norms = [math.sqrt(sum(v * v for v in vector.values())) or 1.0 for vector in vectors]

    def similarity(i: int, j: int) -> float:
        small, large = sorted((vectors[i], vectors[j]), key=len)
        return sum(v * large.get(word, 0.0) for word, v in small.items()) / (norms[i] * norms[j])

    def most_alike(i: int) -> tuple[tuple[int, float], ...]:
        others = sorted(((j, similarity(i, j)) for j in range(len(texts)) if j != i), key=lambda p: (-p[1], p[0]))
        return ((i, 1.0), *others[: k - 1])

    return [most_alike(i) for i in range(len(texts))]
