"""Prefix cache: a tenant's repeat hits, another tenant (different salt) shares nothing."""

from __future__ import annotations

from enclave_worker.engine import SamplingParams

GREEDY = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)


def test_salted_prefix_cache(make_engine, h):
    eng = make_engine()
    prompt = eng.tokenizer.encode("A long shared system prompt about many topics. " * 6)
    assert len(prompt) > 48
    first = h.tokens_of(h.run_sync(eng, [("a1", prompt, GREEDY)], salt=b"tenant-a")["a1"])
    s0 = eng.stats()
    assert s0["prefix_cache_hits"] == 0
    # another tenant, same prompt: no hits
    other = h.tokens_of(h.run_sync(eng, [("b1", prompt, GREEDY)], salt=b"tenant-b")["b1"])
    s1 = eng.stats()
    assert s1["prefix_cache_hits"] == 0
    assert s1["prefix_cache_queries"] > s0["prefix_cache_queries"]
    # the first tenant again: all full blocks but the last token's hit
    again = h.tokens_of(h.run_sync(eng, [("a2", prompt, GREEDY)], salt=b"tenant-a")["a2"])
    s2 = eng.stats()
    assert s2["prefix_cache_hits"] == ((len(prompt) - 1) // 16) * 16
    assert first == other == again


def test_blocks_not_shared_across_salts(make_engine, h):
    eng = make_engine()
    prompt = eng.tokenizer.encode("Tenant isolation matters for shared caches. " * 5)
    seqs = []
    for rid, salt in (("x", b"t1"), ("y", b"t2")):
        eng.add_request(rid, prompt, GREEDY, lambda o: None, salt)
    eng.step()
    for req in eng._requests.values():
        seqs.append(set(req.seq.block_table))
    assert seqs[0].isdisjoint(seqs[1])
    while eng.has_unfinished_requests():
        eng.step()
