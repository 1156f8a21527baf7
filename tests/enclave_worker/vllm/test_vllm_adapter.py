"""The vLLM adapter's own logic (request table, stepping thread, aborts, a failed step, shutdown;
enclave_worker/engine/engine_thread.py, shared with our engine) over a scripted stand-in for vLLM's
engine core, so it runs without vLLM. What vLLM itself answers is test_vllm_engine.py's job."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

import enclave_worker.vllm_engine.engine as adapter
from enclave_worker.engine import EngineDeadError, SamplingParams, Tokenizer
from enclave_worker.engine.errors import InvalidRequestError
from enclave_worker.vllm_engine.engine import VllmEngine

VOCAB = {"<eos>": 0, "a": 1, "b": 2, "c": 3, "[UNK]": 4}


class ScriptedCore:
    """vLLM's LLMEngine as the adapter uses it: every step samples token "a" for each request it holds."""

    def __init__(self) -> None:
        self.held: dict[str, int] = {}  # request id -> tokens still to sample
        self.aborted: list[str] = []
        self.fail = False
        self.refuse: set[str] = set()  # ids vLLM's add_request refuses (its own validation)
        self.error: set[str] = set()  # ids vLLM finishes with its "error" reason (a grammar it failed)

    def add_request(self, request_id: str, inputs: dict[str, Any], params: Any) -> None:
        if request_id in self.refuse:
            raise ValueError("text of a prompt")
        self.held[request_id] = params.max_tokens

    def abort_request(self, ids: list[str]) -> None:
        self.aborted += ids
        for rid in ids:
            self.held.pop(rid, None)

    def step(self) -> list[Any]:
        if self.fail:
            raise RuntimeError("text of a prompt")
        time.sleep(0.005)  # a step takes time: a consumer can stop before a long request ends
        outs = []
        for rid in list(self.held):
            self.held[rid] -= 1
            done = self.held[rid] == 0
            if done:
                del self.held[rid]
            if rid in self.error:
                del self.held[rid]
                outs.append(SimpleNamespace(request_id=rid, finished=True, num_cached_tokens=0, outputs=[
                    SimpleNamespace(token_ids=[], logprobs=None, finish_reason="error")]))
                continue
            outs.append(SimpleNamespace(request_id=rid, finished=done, num_cached_tokens=0, outputs=[
                SimpleNamespace(token_ids=[1], logprobs=None, finish_reason="length" if done else None)]))
        return outs


class ScriptedRuntime:
    max_model_len, block_size = 64, 16

    request_errors = (ValueError, TypeError)

    def __init__(self) -> None:
        self.llm = ScriptedCore()
        self.closed = False

    def enable_structured(self, tokenizer: Tokenizer) -> None:
        self.structured_tokenizer = tokenizer

    def check_structured(self, spec: Any) -> None:
        if spec.spec == "(unclosed":  # the real one asks vLLM and llguidance (test_vllm_engine.py)
            raise InvalidRequestError("the regex is not valid")

    def kv_stats(self) -> dict[str, Any]:
        return {}

    def metrics(self) -> dict[str, Any]:
        self.metric_reads = getattr(self, "metric_reads", 0) + 1
        return {"vllm:prompt_tokens": float(self.metric_reads)}

    def held_tensors(self) -> list[Any]:
        return []

    def bind_stepping_thread(self) -> None:
        self.bound = True  # the real one pins the thread as vLLM's CPU worker; nothing to pin here

    def close(self) -> None:
        self.closed = True


@pytest.fixture()
def engine(monkeypatch: pytest.MonkeyPatch) -> VllmEngine:
    # vLLM's SamplingParams, minus vLLM: the scripted core reads max_tokens only.
    monkeypatch.setattr(adapter, "vllm_sampling",
                        lambda params, max_tokens, eos: SimpleNamespace(max_tokens=max_tokens))
    hf = HFTokenizer(WordLevel(VOCAB, unk_token="[UNK]"))
    hf.pre_tokenizer = Whitespace()
    tokenizer = Tokenizer(hf.to_str(), None, {"eos_token_id": 0, "vocab_size": len(VOCAB)})
    return VllmEngine(ScriptedRuntime(), tokenizer)  # type: ignore[arg-type]


async def _collect(engine: VllmEngine, rid: str, max_tokens: int) -> list[Any]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return [o async for o in engine.generate(rid, [1, 2, 3], params)]


async def test_requests_stream_to_their_end_and_shutdown_closes_vllm(engine: VllmEngine) -> None:
    first, second = await asyncio.wait_for(asyncio.gather(_collect(engine, "r1", 3), _collect(engine, "r2", 5)), 30)
    assert sum(len(o.delta_token_ids) for o in first) == 3 and first[-1].finish_reason == "length"
    assert sum(len(o.delta_token_ids) for o in second) == 5 and second[-1].finished
    assert not engine.has_unfinished_requests()
    await engine.shutdown()
    assert engine.runtime.closed  # type: ignore[attr-defined]


async def test_a_consumer_that_stops_aborts_its_request_in_vllm(engine: VllmEngine) -> None:
    gen = engine.generate("long", [1, 2], SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    await gen.__anext__()
    await gen.aclose()
    for _ in range(200):  # the abort reaches vLLM at the thread's next step
        if "long" in engine.runtime.llm.aborted:  # type: ignore[attr-defined]
            break
        await asyncio.sleep(0.01)
    assert engine.runtime.llm.aborted == ["long"]  # type: ignore[attr-defined]
    assert not engine.has_unfinished_requests()
    await engine.shutdown()


async def test_a_failed_step_fails_every_request_by_type_only(engine: VllmEngine) -> None:
    engine.runtime.llm.fail = True  # type: ignore[attr-defined]
    with pytest.raises(EngineDeadError) as failed:
        await asyncio.wait_for(_collect(engine, "r1", 3), 30)
    assert "RuntimeError" in str(failed.value) and "prompt" not in str(failed.value)
    with pytest.raises(EngineDeadError):
        await _collect(engine, "r2", 3)
    assert json.dumps(engine.stats())  # still answers its status
    await engine.shutdown()


def test_penalties_bias_and_min_p_reach_vllms_sampling_params() -> None:
    params = SamplingParams(max_tokens=9, temperature=0.5, presence_penalty=0.5, frequency_penalty=-1.0,
                            repetition_penalty=1.3, min_p=0.1, logit_bias=((4, -100.0), (2, 3.0)))
    kwargs = adapter.vllm_sampling_kwargs(params, 9, (0,))
    assert (kwargs["presence_penalty"], kwargs["frequency_penalty"], kwargs["repetition_penalty"],
            kwargs["min_p"], kwargs["logit_bias"]) == (0.5, -1.0, 1.3, 0.1, {4: -100.0, 2: 3.0})
    assert adapter.vllm_sampling_kwargs(SamplingParams(), 9, (0,))["logit_bias"] is None


def test_each_constraint_reaches_vllm_as_the_grammar_our_engine_builds() -> None:
    """What StructuredOutputsParams gets (vLLM's guidance backend then compiles the same grammar text
    as our engine: test_vllm_engine.py), and a constrained request stops on EOS even under
    ignore_eos (once the grammar is complete EOS is all vLLM's mask allows)."""
    from enclave_worker.engine.structured import JSON_DEFAULTS
    from enclave_worker.vllm_engine.structured import vllm_structured_kwargs
    from protocol.sampling import StructuredOutput

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "x-guidance": {"key_separator": ":"}}
    assert vllm_structured_kwargs(StructuredOutput("json_schema", json.dumps(schema))) == {
        "json": {**schema, "x-guidance": {**JSON_DEFAULTS, "key_separator": ":"}}}
    assert vllm_structured_kwargs(StructuredOutput("regex", "[0-9]+")) == {"regex": "[0-9]+"}
    assert vllm_structured_kwargs(StructuredOutput("lark", 'start: "a"')) == {"grammar": 'start: "a"'}
    constrained = SamplingParams(max_tokens=4, ignore_eos=True, structured=StructuredOutput("regex", "a"))
    assert adapter.vllm_sampling_kwargs(constrained, 4, (0,))["stop_token_ids"] == [0]
    assert adapter.vllm_sampling_kwargs(SamplingParams(max_tokens=4, ignore_eos=True), 4, (0,))["stop_token_ids"] == []


def test_a_constraint_vllm_cannot_build_is_that_requests_400(engine: VllmEngine) -> None:
    from protocol.sampling import StructuredOutput

    with pytest.raises(InvalidRequestError, match="not valid"):
        engine.validate("r1", [1, 2, 3], SamplingParams(structured=StructuredOutput("regex", "(unclosed")), b"")
    engine.validate("r1", [1, 2, 3], SamplingParams(structured=StructuredOutput("regex", "[ab]+")), b"")
    assert engine.runtime.structured_tokenizer is engine.tokenizer  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["refused when added", "failed by vLLM"])
async def test_a_request_vllm_fails_alone_ends_alone(engine: VllmEngine, how: str) -> None:
    """vLLM refusing a request (its own validation) or finishing it with its "error" reason (a grammar
    it could not compile) fails that request with a request error, by type only; the engine and the
    other requests go on. Before, a refusal raised on the stepping thread and killed the engine."""
    core = engine.runtime.llm  # type: ignore[attr-defined]
    (core.refuse if how == "refused when added" else core.error).add("bad")
    ok = asyncio.create_task(_collect(engine, "ok", 4))
    with pytest.raises(InvalidRequestError) as failed:
        await asyncio.wait_for(_collect(engine, "bad", 4), 30)
    assert "prompt" not in str(failed.value)
    assert (await asyncio.wait_for(ok, 30))[-1].finish_reason == "length"
    assert sum(len(o.delta_token_ids) for o in await _collect(engine, "after", 2)) == 2
    assert not engine.has_unfinished_requests()
    await engine.shutdown()


def test_vllms_metrics_are_read_at_most_once_a_second_however_often_the_status_is_asked() -> None:
    """The delivery probe asks for the worker's status every 50 ms; vLLM's Prometheus snapshot costs
    milliseconds of Python that the stepping thread waits on (the GIL), so it is reused for a second."""
    hf = HFTokenizer(WordLevel(VOCAB, unk_token="[UNK]"))
    now = [100.0]
    runtime = ScriptedRuntime()
    eng = VllmEngine(runtime, Tokenizer(hf.to_str(), None, {"eos_token_id": 0, "vocab_size": len(VOCAB)}),  # type: ignore[arg-type]
                     clock=lambda: now[0])
    for _ in range(20):  # a second of probes
        assert eng.stats()["vllm:prompt_tokens"] == 1.0
        now[0] += adapter.METRICS_MAX_AGE_S / 20 - 1e-6
    assert runtime.metric_reads == 1
    now[0] += 1e-3
    assert eng.stats()["vllm:prompt_tokens"] == 2.0  # a second old: read again
    assert eng.stats()["num_running"] == 0  # the adapter's own figures are always current
    assert runtime.metric_reads == 2
