"""The garbage collector of a process that serves: ``tune_gc_for_serving``."""

import gc

YOUNG_COLLECTION_EVERY = 10_000
"""The collector's first threshold in a serving process: allocations between collections of the youngest objects
(Python's default: 700)."""


def tune_gc_for_serving() -> None:
    """Keep the garbage collector off the objects alive now, and collect young objects less often; call it once the
    app is built, in each server process (``conductor serve`` does). Process-wide, so the app doesn't do it itself.

    A served process holds hundreds of thousands of objects from its start (the program, DSPy, litellm, FastAPI:
    about 410,000, which a full collection took 160 ms to walk), and a run in flight lives long enough to reach the
    oldest generation, so full collections came often: under 256 concurrent requests they were nearly a third of the
    server's CPU and many of its slowest answers (``benchmarks/server_load.py``, ``docs/results.md``). Frozen objects
    are still freed by reference counting; a frozen cycle that becomes garbage stays.
    """
    gc.freeze()
    _, *older = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, *older)
