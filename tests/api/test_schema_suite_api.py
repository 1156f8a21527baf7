"""#36's acceptance suite through the API on our engine: every one of the 33 JSON schemas
(tests/enclave_worker/schema_suite.py) in all four modes (plaintext and sealed, streamed and not), at
temperature 1, through the gateway and the official openai SDK (SealedOpenAI for sealed): every
answer complete and valid. The same suite runs at engine level on both engines, with unconstrained
controls that fail (so the suite can fail), and through the API on the vLLM backend
(tests/api/test_vllm_stack.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any as RunningStack

from api.stack import DEMO_MODEL
from tests.api.test_sealed_e2e import plain, sealed
from tests.enclave_worker.schema_suite import MAX_TOKENS, SCHEMAS, ask, valid

MODES = [(is_sealed, stream) for is_sealed in (False, True) for stream in (False, True)]


def test_every_schema_in_every_mode_validates(stack: RunningStack) -> None:
    clients = {False: plain(stack), True: sealed(stack)}

    def one(job: tuple[int, tuple[bool, bool]]) -> tuple[str, str, str | None, tuple[bool, bool]]:
        i, (is_sealed, stream) = job
        what, schema = SCHEMAS[i]
        args: dict = {"model": DEMO_MODEL, "messages": [{"role": "user", "content": ask(what)}],
                      "temperature": 1.0, "seed": i, "max_tokens": MAX_TOKENS, "response_format": {
                          "type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}}
        api = clients[is_sealed].chat.completions
        if not stream:
            choice = api.create(**args).choices[0]
            return what, choice.message.content or "", choice.finish_reason, (is_sealed, stream)
        chunks = [c for c in api.create(**args, stream=True) if c.choices]
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        return what, text, chunks[-1].choices[0].finish_reason, (is_sealed, stream)

    jobs = [(i, mode) for i in range(len(SCHEMAS)) for mode in MODES]
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(one, jobs))
    bad = [a for a, (i, _) in zip(answers, jobs, strict=True)
           if a[2] != "stop" or not valid(a[1], SCHEMAS[i][1])]
    assert not bad, bad
    assert len(answers) == len(SCHEMAS) * 4 and {a[3] for a in answers} == set(MODES)
