"""vLLM's log lines that quote token ids keep their text but lose the ids (the worker logs no
completion), and the prefixes the filter knows are the ones the installed vLLM writes."""

from __future__ import annotations

import logging
import os
import subprocess

import pytest

from api.vllm_python import find_vllm_python
from enclave_worker.vllm_engine import log_redaction

TOKENS = [48213, 1937, 40111]


@pytest.mark.parametrize(("logger", "message", "args"), [
    ("vllm.v1.core.sched.scheduler", "Unexpected: grammar rejected tokens %s for request %s. Terminating request.",
     (TOKENS, "req-7")),
    ("vllm.v1.structured_output", "Unexpected: grammar terminated or rejected draft token %s for request %s "
     "during bitmask fill.", (TOKENS[0], "req-7")),
    ("vllm.v1.structured_output.backend_guidance", "LLMatcher error: %s", ("unexpected 'Alice was here'",)),
    ("vllm.v1.structured_output.backend_xgrammar", "Failed to advance FSM for request %s for tokens %s. "
     "Please file an issue.", ("req-7", TOKENS[1])),
])
def test_content_carrying_lines_lose_their_arguments(caplog: pytest.LogCaptureFixture, logger: str, message: str,
                                                     args: tuple) -> None:
    log_redaction.install()
    log_redaction.install()  # idempotent
    assert sum(isinstance(f, log_redaction.WithholdContent) for f in logging.getLogger(logger).filters) == 1
    with caplog.at_level(logging.WARNING, logger=logger):
        logging.getLogger(logger).error(message, *args)
    text = caplog.text
    assert "details withheld" in text
    assert not any(str(t) in text for t in TOKENS) and "Alice" not in text and "req-7" not in text


def test_other_lines_pass_unchanged(caplog: pytest.LogCaptureFixture) -> None:
    log_redaction.install()
    with caplog.at_level(logging.WARNING, logger="vllm.v1.core.sched.scheduler"):
        logging.getLogger("vllm.v1.core.sched.scheduler").warning("KV cache %s%% full", 93)
    assert "KV cache 93% full" in caplog.text


def test_the_installed_vllm_writes_these_lines() -> None:
    """If an upgrade rewords a line, the filter would pass it unredacted: this fails first."""
    python = find_vllm_python()
    if python is None:
        if os.environ.get("SEALED_REQUIRE_VLLM"):
            pytest.fail("vLLM is required (SEALED_REQUIRE_VLLM) but no vLLM interpreter was found")
        pytest.skip("no vLLM virtualenv (docs/vllm-backend.md)")
    code = ("import pathlib, sys, vllm; root = pathlib.Path(vllm.__file__).parent / 'v1'; "
            "text = ''.join(p.read_text() for p in root.rglob('*.py')); "
            "missing = [m for m in sys.argv[1:] if m not in text]; print(missing); sys.exit(1 if missing else 0)")
    run = subprocess.run([python, "-c", code, *log_redaction.CONTENT_MESSAGES], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
