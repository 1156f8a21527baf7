"""Structured output on the vLLM backend: our constraints (protocol/sampling.py::StructuredOutput) as
vLLM's own `StructuredOutputsParams`, enforced by vLLM's `guidance` backend (llguidance, the library
our engine uses: enclave_worker/engine/structured.py).

vLLM's structured outputs need a tokenizer, and this backend starts vLLM without one
(``skip_tokenizer_init``: the worker tokenizes, and no tokenizer file is written to disk). So once
vLLM is built, `install` gives it one made in memory from the package's tokenizer.json: a fast
Hugging Face tokenizer for vLLM's request validation, and a guidance backend whose llguidance
tokenizer is built exactly as our engine builds its own (same vocabulary size, same EOS ids). The
grammar state lives in vLLM's scheduler, inside the worker; vLLM masks the logits with it.

Each kind of constraint reaches vLLM as the grammar text our engine compiles (a test compares the
two): a JSON schema with our compact layout set in its `x-guidance` (vLLM's own default lets a
sampled model pad JSON with whitespace until max_tokens), a regex as is, a Lark grammar as is.
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from enclave_worker.engine.structured import JSON_DEFAULTS
from enclave_worker.engine.tokenizer import Tokenizer
from protocol.sampling import StructuredOutput

BACKEND = "guidance"  # vLLM's llguidance backend (EngineArgs.structured_outputs_config)


def vllm_structured_kwargs(spec: StructuredOutput) -> dict[str, Any]:
    """`StructuredOutputsParams` arguments that make vLLM's guidance backend build our grammar."""
    if spec.kind == "json_schema":
        doc = json.loads(spec.spec)
        if isinstance(doc, dict):  # the schema's own x-guidance keys win, as in our engine
            doc = {**doc, "x-guidance": {**JSON_DEFAULTS, **(doc.get("x-guidance") or {})}}
        return {"json": doc}
    if spec.kind == "regex":
        return {"regex": spec.spec}
    return {"grammar": spec.spec}  # lark: vLLM's `grammar` takes Lark text as is


def vllm_structured(spec: StructuredOutput) -> Any:
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(**vllm_structured_kwargs(spec))


def _hf_tokenizer(tokenizer: Tokenizer) -> Any:
    """A fast HF tokenizer over the package's tokenizer.json, built in memory (never a file)."""
    from tokenizers import Tokenizer as RustTokenizer
    from transformers import PreTrainedTokenizerFast
    from vllm.tokenizers.hf import get_cached_tokenizer

    hf = PreTrainedTokenizerFast(tokenizer_object=RustTokenizer.from_str(tokenizer.to_json()))  # type: ignore[no-untyped-call]
    if tokenizer.eos_token:
        hf.eos_token = tokenizer.eos_token
    return get_cached_tokenizer(hf)  # what vLLM wraps its own tokenizers in (the properties it reads)


def _backend_class(tokenizer: Tokenizer) -> Any:
    from llguidance import LLTokenizer
    from vllm.v1.structured_output.backend_guidance import GuidanceBackend

    class SealedGuidanceBackend(GuidanceBackend):  # type: ignore[misc]
        """vLLM's guidance backend with the llguidance tokenizer our engine builds (GrammarCompiler):
        from the package's tokenizer.json, every EOS id of the model, the model's vocabulary."""

        def _build_ll_tokenizer(self, hf: Any, vocab_size: int) -> Any:
            return LLTokenizer(tokenizer.to_json(), n_vocab=max(vocab_size, tokenizer.vocab_size),
                               eos_token=list(tokenizer.eos_token_ids) or None)

    return SealedGuidanceBackend


def install(llm: Any, tokenizer: Tokenizer) -> tuple[Any, ThreadPoolExecutor]:
    """Give vLLM's request validation and its structured-output manager a tokenizer. Returns it and
    the grammar-compilation executor vLLM now uses, which the runtime shuts down on close (vLLM
    only shuts down the one it made itself, and it made none without a tokenizer)."""
    # llguidance's own messages and vLLM's "LLMatcher error" warnings can quote the generated text
    # or the schema: never logged (vLLM's default log level for llguidance is 1, to stderr).
    os.environ["LLGUIDANCE_LOG_LEVEL"] = "0"
    logging.getLogger("vllm.v1.structured_output.backend_guidance").setLevel(logging.ERROR)
    hf = _hf_tokenizer(tokenizer)
    llm.renderer.tokenizer = hf  # read by vLLM's input processor (SamplingParams.verify)
    core = llm.engine_core.engine_core  # in-process engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    manager = core.structured_output_manager
    vocab = llm.vllm_config.model_config.get_vocab_size()
    manager.tokenizer = hf
    manager.backend = _backend_class(tokenizer)(llm.vllm_config, tokenizer=hf, vocab_size=vocab)
    # Grammars compile off the stepping thread, one at a time (a schema costs milliseconds).
    manager.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-grammar")
    return hf, manager.executor
