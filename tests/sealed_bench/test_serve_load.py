"""The serving benchmarks' prompts (sealed_bench/serve_load.py): every run draws a set no earlier run
served, so no run is measured on the engine's prefix cache (which favoured whichever mode came later
when the sealed and tracing pairs reused one set)."""

from __future__ import annotations

from sealed_bench.serve_load import FreshPrompts, load_tokenizer


def test_every_run_gets_prompts_no_earlier_run_served() -> None:
    tokenizer = load_tokenizer(None)
    fresh = FreshPrompts(4, 32, seed=7, tokenizer=tokenizer)
    draws = [fresh.next() for _ in range(3)]
    served = [p for d in draws for p in d]
    assert len(set(served)) == len(served) == 12
    assert all(len(tokenizer.encode(p, add_special_tokens=False).ids) == 32 for p in served)
    again = FreshPrompts(4, 32, seed=7, tokenizer=tokenizer)
    assert [again.next() for _ in range(3)] == draws  # reproducible from the seed


def test_a_peer_that_makes_its_own_prompts_gets_a_new_seed_per_run() -> None:
    seeds = FreshPrompts(0, 0, seed=0, tokenizer=None)
    drawn = [seeds.next_seed() for _ in range(6)]
    assert len(set(drawn)) == 6 and drawn[0] == 0
