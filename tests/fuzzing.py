"""Shared pieces of the property-based parser tests: mutations of real inputs, and the budget.

One Hypothesis draw (a seed) per example, the mutations following from a seeded PRNG, keeps
generation cheap, so the example counts below buy parser work, not strategy overhead. The counts
are sized so that every suite using `budget` adds about a minute to the test run on 2 cores.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Deep nesting is the one JSON input that raises RecursionError rather than ValueError.
DEEP_JSON = (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000)


def budget(examples: int) -> settings:
    """Bounded, deterministic-enough settings: no deadline (a loaded CI machine is slow), no database."""
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def mutate(rng: random.Random, seed: bytes) -> bytes:
    """`seed` with a few bytes overwritten or XORed, then maybe truncated, extended or spliced into."""
    data = bytearray(seed)
    for _ in range(rng.randrange(1, 5) if data else 0):
        at = rng.randrange(len(data))
        data[at] = rng.randrange(256) if rng.random() < 0.5 else data[at] ^ (1 << rng.randrange(8))
    cut = rng.choice(["none", "none", "truncate", "insert", "delete", "extend"])
    if cut == "truncate":
        del data[rng.randrange(len(data) + 1):]
    elif cut == "insert":
        at = rng.randrange(len(data) + 1)
        data[at:at] = rng.randbytes(rng.randrange(1, 9))
    elif cut == "delete" and data:
        at = rng.randrange(len(data))
        del data[at:at + rng.randrange(1, 17)]
    elif cut == "extend":
        data += rng.randbytes(rng.randrange(1, 9))
    return bytes(data)


def mutated(seeds: Sequence[bytes]) -> st.SearchStrategy[bytes]:
    """Mutations of the seeds (real vectors), the seeds themselves, and a little noise."""
    chosen = st.builds(lambda s: (lambda rng: mutate(rng, rng.choice(list(seeds))))(random.Random(s)),
                       st.integers(0, 2**64))
    return st.one_of(chosen, chosen, chosen, st.sampled_from(list(seeds)), st.binary(max_size=256))
