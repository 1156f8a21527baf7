"""Traces of live requests through a real `sealed up` stack (gateway, worker, key broker as their own
processes), exported over OTLP/HTTP to a receiver in the test: one streamed plaintext and one
streamed sealed request each give one trace, gateway -> worker across the gRPC hop, with the
admission, routing, queue, prefill and decode spans; a canary in the prompts is in no export."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from api.stack import DEMO_MODEL
from sealed_client import SealedOpenAI
from tests.api.conftest import RunningStack, start_sealed_up, stop_sealed_up
from tests.api.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.api.sealed_helpers import demo_client_policy

CANARY = f"canary-{secrets.token_hex(8)}"
GATEWAY = {"gateway.request", "gateway.admission", "gateway.route", "gateway.worker_call"}
SERVER_KIND, CLIENT_KIND = 2, 3  # OTLP's SpanKind numbers


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningStack, OtlpReceiver]]:
    receiver = OtlpReceiver()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # export within a tenth of a second
        stack = start_sealed_up(tmp_path_factory.mktemp("traced"))
    try:
        yield stack, receiver
    finally:
        if stack.proc.poll() is None:
            stop_sealed_up(stack)
        receiver.close()


def _trace_of(spans: list[ReceivedSpan], sealed: bool, rid: str | None = None) -> list[ReceivedSpan]:
    """The last trace of a (plaintext or sealed) request, or of request `rid` (`sealed up` sends its
    own requests too)."""
    roots = [s for s in spans if s.name == "gateway.request" and s.attributes.get("sealed.sealed") is sealed
             and rid in (None, s.attributes.get("sealed.request_id"))]
    if not roots:
        return []
    return [s for s in spans if s.trace_id == roots[-1].trace_id]


def _complete(trace: list[ReceivedSpan]) -> bool:
    return "worker.decode" in {s.name for s in trace} and "gateway.request" in {s.name for s in trace}


def _check_linkage(trace: list[ReceivedSpan], method: str) -> dict[str, ReceivedSpan]:
    by_name = {s.name: s for s in trace}
    assert GATEWAY | {f"worker.{method}", "worker.prefill", "worker.decode"} <= set(by_name), sorted(by_name)
    root, call, served = by_name["gateway.request"], by_name["gateway.worker_call"], by_name[f"worker.{method}"]
    assert root.service == "sealed-gateway" and root.kind == SERVER_KIND
    for child in ("gateway.admission", "gateway.route", "gateway.worker_call"):
        assert by_name[child].parent_span_id == root.span_id, child
    # Across the gRPC hop: the worker's server span is the child of the gateway's client span.
    assert call.kind == CLIENT_KIND and served.kind == SERVER_KIND
    assert served.service == "sealed-worker" and served.parent_span_id == call.span_id
    for stage in ("worker.prefill", "worker.decode", "worker.queue"):
        if stage in by_name:
            assert by_name[stage].parent_span_id == served.span_id and by_name[stage].service == "sealed-worker"
    assert by_name["worker.prefill"].end_ns <= by_name["worker.decode"].end_ns
    assert call.attributes["sealed.worker_id"] == by_name["gateway.route"].attributes["sealed.worker_id"]
    return by_name


def test_a_streamed_plaintext_request_is_one_trace_across_the_grpc_hop(traced: tuple[RunningStack, OtlpReceiver]
                                                                       ) -> None:
    stack, receiver = traced
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0)
    chunks = list(client.chat.completions.create(model=DEMO_MODEL, max_tokens=8, stream=True, messages=[
        {"role": "user", "content": f"Repeat {CANARY} please"}]))
    rid = chunks[0].id.removeprefix("chatcmpl-")
    trace = _trace_of(receiver.wait_for(lambda spans: _complete(_trace_of(spans, False, rid))), False, rid)
    by_name = _check_linkage(trace, "Generate")
    root = by_name["gateway.request"]
    assert root.attributes["sealed.request_id"] == rid and root.attributes["gen_ai.request.model"] == DEMO_MODEL
    assert root.attributes["gen_ai.usage.output_tokens"] == by_name["worker.decode"].attributes[
        "gen_ai.usage.output_tokens"] > 0
    assert by_name["worker.Generate"].attributes["sealed.request_id"] == f"{rid}-0"
    assert "worker.queue" in by_name  # our engine says when the request got its batch slot


def test_a_streamed_sealed_request_is_traced_without_sizes_from_inside_the_worker(
        traced: tuple[RunningStack, OtlpReceiver]) -> None:
    stack, receiver = traced
    client = SealedOpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0,
                          policy=demo_client_policy(stack.home))
    list(client.chat.completions.create(model=DEMO_MODEL, max_tokens=8, stream=True, messages=[
        {"role": "user", "content": f"Repeat {CANARY} please"}]))
    trace = _trace_of(receiver.wait_for(lambda spans: _complete(_trace_of(spans, True))), True)
    by_name = _check_linkage(trace, "SealedGenerate")
    for span in trace:
        if span.service == "sealed-worker":  # ids only: no token counts, sizes or flags from inside
            assert set(span.attributes) <= {"rpc.system", "rpc.service", "rpc.method", "sealed.request_id"}
    assert by_name["gateway.request"].attributes["sealed.body_bytes"] > 0  # what the gateway relays anyway


def test_no_prompt_or_completion_text_in_any_export(traced: tuple[RunningStack, OtlpReceiver], tmp_path: Path
                                                   ) -> None:
    stack, receiver = traced
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0)
    answer = client.chat.completions.create(model=DEMO_MODEL, max_tokens=8, messages=[
        {"role": "user", "content": f"Say {CANARY}"}])
    rid = answer.id.removeprefix("chatcmpl-")
    receiver.wait_for(lambda spans: _complete(_trace_of(spans, False, rid)))
    exports = b"".join(receiver.raw)
    # The check below can see text: the request's id (an attribute) is there as plain bytes.
    assert rid.encode() in exports
    assert CANARY.encode() not in exports
    text = answer.choices[0].message.content or ""
    words = [w for w in text.split() if len(w) >= 6]
    assert all(w.encode() not in exports for w in words)
    for span in receiver.spans:
        for value in span.attributes.values():
            assert not (isinstance(value, str) and CANARY in value)


def test_the_workers_key_release_is_traced_into_the_key_broker(traced: tuple[RunningStack, OtlpReceiver]) -> None:
    _, receiver = traced

    def released(spans: list[ReceivedSpan]) -> bool:
        return {"worker.key_release", "broker.attest", "broker.key_release"} <= {s.name for s in spans}

    spans = receiver.wait_for(released)
    client = next(s for s in spans if s.name == "worker.key_release")
    assert client.service == "sealed-worker" and client.kind == CLIENT_KIND
    for name in ("broker.attest", "broker.key_release"):
        server = next(s for s in spans if s.name == name and s.parent_span_id == client.span_id)
        assert server.service == "sealed-key-broker" and server.kind == SERVER_KIND
        assert server.trace_id == client.trace_id and server.attributes["sealed.decision"] == "allow"
