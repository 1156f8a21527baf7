"""An auto answer's grammar (protocol/openai/tool_grammar.py) is written in the hermes call syntax: a
family that writes calls another way gets a clear refusal, never an answer left unconstrained."""

from __future__ import annotations

import pytest

from enclave_worker.engine import InvalidRequestError
from enclave_worker.family_tool_calls import native_structured
from enclave_worker.tool_syntax import LLAMA3_JSON, MISTRAL, SYNTAXES, WORKER_HERMES
from protocol.openai.tool_grammar import auto_tools_constraint
from protocol.sampling import StructuredOutput

TOOLS = [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {"type": "object"}}}]
AUTO = auto_tools_constraint(TOOLS, None, False)


@pytest.mark.parametrize("family", [LLAMA3_JSON, MISTRAL])
def test_other_families_refuse_the_auto_grammar(family: str) -> None:
    with pytest.raises(InvalidRequestError, match=family):
        native_structured(SYNTAXES[family], "", AUTO)


def test_hermes_families_take_it_unchanged_and_other_constraints_pass() -> None:
    assert native_structured(WORKER_HERMES, "", AUTO) is AUTO
    assert native_structured(SYNTAXES["hermes"], "", AUTO) is AUTO
    schema = StructuredOutput("json_schema", '{"type": "object"}')  # guided_json beside plain auto tools
    assert native_structured(SYNTAXES[LLAMA3_JSON], "", schema) is schema
    assert native_structured(SYNTAXES[LLAMA3_JSON], "", None) is None
