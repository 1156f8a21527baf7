"""vLLM behind our engine interface, from an encrypted package (docs/vllm-backend.md).

Two vLLM processes for the module: `vllm_checks.py sealed` (our loader, our adapter) and
`vllm_checks.py plain` (vLLM's own loader on plaintext safetensors, the reference). The reference
directory is written by this test into its temporary directory for the comparison only; product
code never writes plaintext weights.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from safetensors.torch import save_file

from api.tenant_tools import default_model_path, encrypt_checkpoint
from enclave_worker.engine.checkpoint import load_gguf
from enclave_worker.vllm_engine.runtime import architecture_config

pytestmark = pytest.mark.vllm
CHECKS = Path(__file__).with_name("vllm_checks.py")
REPO = Path(__file__).resolve().parents[3]


def _run_checks(python: str, *args: str, timeout: float = 1500) -> dict:
    out = Path(args[-1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([python, str(CHECKS), *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def results(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("vllm-engine")
    checkpoint = load_gguf(default_model_path())
    encrypted = encrypt_checkpoint(checkpoint, root / "pkg", tenant="t", model="m", version="1",
                                   signing_key=Ed25519PrivateKey.generate())
    sealed = _run_checks(vllm_python, "sealed", str(root / "pkg"), encrypted.data_key.hex(), str(root / "sealed.json"))
    # The reference only: plaintext safetensors in this test's temporary directory.
    plain_dir = root / "plain"
    plain_dir.mkdir()
    save_file({k: v.contiguous() for k, v in checkpoint.tensors.items()}, str(plain_dir / "model.safetensors"))
    (plain_dir / "config.json").write_text(json.dumps(architecture_config(checkpoint.config)))
    (plain_dir / "sealed-test-meta.json").write_text(json.dumps({
        "config": checkpoint.config, "tokenizer_json": checkpoint.tokenizer_json,
        "chat_template": checkpoint.chat_template}))
    plain = _run_checks(vllm_python, "plain", str(plain_dir), str(root / "plain.json"))
    return {"sealed": sealed, "plain": plain}


def test_greedy_tokens_equal_vllm_loading_the_plaintext_model(results: dict) -> None:
    sealed, plain = results["sealed"]["greedy"], results["plain"]["greedy"]
    assert len(sealed) == len(plain) == 8
    assert all(len(t) > 0 for t in sealed)
    assert sealed == plain
    assert "Paris" in results["sealed"]["texts"][0]


def test_the_decrypted_buffer_is_zero_once_vllm_holds_the_weights(results: dict) -> None:
    assert results["sealed"]["buffer_nonzero_after_load"] == 0


def test_prefix_cache_hits_within_a_tenant_and_never_across(results: dict) -> None:
    hits = results["sealed"]["prefix_hits"]
    full_blocks = (hits["prompt_tokens"] - 1) // hits["block_size"]
    assert full_blocks >= 2
    assert hits["a_first"] == 0
    assert hits["a_repeat"] >= (full_blocks - 1) * hits["block_size"]
    assert hits["b_first"] == 0  # the same prompt under another tenant's salt shares no block


def test_stop_strings_stop_ids_and_logprobs_as_with_our_engine(results: dict) -> None:
    r = results["sealed"]
    stop = r["stop_string"]
    assert stop["finish"] == "stop" and "Paris" not in stop["text"]
    stop_id = r["stop_id"]
    assert stop_id["finish"] == "stop" and stop_id["tokens"][-1] == stop_id["stop_token"]
    assert len(stop_id["tokens"]) <= 3
    lps = r["logprobs"]["logprobs"]
    assert len(lps) == r["logprobs"]["completion_tokens"] == len(r["logprobs"]["tokens"])
    for (token, logprob, top), sampled in zip(lps, r["logprobs"]["tokens"], strict=True):
        assert token == sampled and logprob <= 0 and len(top) == 3
        assert top[0][0] == sampled  # greedy: the sampled token is the most likely one
        assert [t[1] for t in top] == sorted((t[1] for t in top), reverse=True)
    assert r["seeded"][0] == r["seeded"][1]


def test_cancelling_the_stream_aborts_the_vllm_request(results: dict) -> None:
    assert results["sealed"]["unfinished_after_cancel"] == 0


def test_revocation_wipe_zeroes_weights_and_kv_cache_then_frees_them(results: dict) -> None:
    wipe = results["sealed"]["wipe"]
    assert wipe["kv_tensors"] >= 1 and wipe["kv_nonzero_before"] >= 1
    assert wipe["nonzero_before"] > wipe["kv_tensors"]
    assert wipe["nonzero_after"] == 0
    assert wipe["released"]


def test_the_wipe_reaches_every_byte_of_the_onednn_packed_weights(results: dict) -> None:
    """On the CPU the linear layers run oneDNN over packed copies (packed.py): every copy is one
    the wipe holds, and afterwards every byte of each (padding included) is zero."""
    wipe = results["sealed"]["wipe"]
    assert wipe["packed"] >= 30 * 4 + 1  # q/k/v, o, gate/up, down in each of 30 layers; the LM head
    assert wipe["packed_held"] == wipe["packed"]
    assert wipe["packed_nonzero_before"] == wipe["packed"]
    assert wipe["packed_nonzero_after"] == 0


def test_the_stepping_thread_computes_on_every_cpu_the_worker_may_use(results: dict) -> None:
    """The worker's default binding (VllmOptions.cpu_binding, binding.py): every CPU of the
    process's affinity bound for compute, none reserved. vLLM's own default (`auto`) kept one of
    two vCPUs for a frontend process the worker does not run, and computed on the other."""
    stepping = results["sealed"]["stepping"]
    assert stepping["cpus"] == stepping["all_cpus"]
    assert stepping["thread_cpus"] == sorted(stepping["cpus"])
    assert stepping["env"]["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert stepping["omp_bind"] == stepping["env"]["VLLM_CPU_OMP_THREADS_BIND"] != "auto"


def test_vllm_is_built_on_the_thread_that_steps_it(results: dict) -> None:
    """One OpenMP team in the process, the stepping thread's (VllmEngine.on_compute_thread): vLLM's
    build (its CPU worker's thread binding, its warm-up run) ran on the thread that steps it."""
    sealed = results["sealed"]
    assert sealed["built_on"] == [sealed["stepping"]["thread"]]
    assert sealed["stepping"]["thread"] != sealed["stepping"]["main"]


def test_every_schema_of_the_suite_is_enforced_by_vllm_and_free_answers_fail(results: dict) -> None:
    """The acceptance suite (schema_suite.py) on the vLLM backend: all at once at temperature 1,
    every answer complete and valid, streamed in several deltas; the first schemas asked without
    their constraint mostly fail (so this can fail)."""
    from tests.enclave_worker.schema_suite import FREE, SCHEMAS, valid

    s = results["sealed"]["structured"]
    answers = s["schemas"]
    assert len(answers) == len(SCHEMAS) >= 30
    bad = [(what, a) for (what, schema), a in zip(SCHEMAS, answers, strict=True)
           if a["finish"] != "stop" or not valid(a["text"], schema)]
    assert not bad, bad
    assert sum(a["deltas"] > 1 for a in answers) >= len(SCHEMAS) - 3  # streamed, not one piece at the end
    assert sum(not valid(a["text"], schema) for (_, schema), a in zip(SCHEMAS[:FREE], s["free"], strict=True)) >= 4


def test_regex_named_tool_arguments_and_refusals_on_vllm(results: dict) -> None:
    import jsonschema

    from tests.enclave_worker.vllm.structured_checks import WEATHER_ARGS

    s = results["sealed"]["structured"]
    assert s["regex"]["text"] in {"yes", "no", "maybe"} and s["regex"]["finish"] == "stop"  # ignore_eos too
    tool = s["tool"]
    assert tool["finish"] == "stop" and tool["text"].endswith("}")
    jsonschema.validate(json.loads(tool["text"][:-1]), WEATHER_ARGS)  # the arguments, then the call's brace
    assert set(s["refused"]) == {"json_schema", "regex", "lark"}
    assert all(msg.startswith(f"the {kind} is not valid") for kind, msg in s["refused"].items()), s["refused"]
    assert s["serving_after"] in {"stop", "length"}  # a refused constraint failed no other request


def test_vllm_compiles_the_grammar_text_our_engine_compiles(results: dict) -> None:
    parity = results["sealed"]["structured"]["parity"]
    assert len(parity) >= 32 and all(parity)
