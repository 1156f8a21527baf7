"""llama-server's command and binary lookup (llama_side.py), `sealed bench llamaserve`'s refusals and
`sealed up --gguf-quant`'s: no llama-server needed."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sealed_bench.bench_llamaserve import main as llamaserve
from sealed_bench.llama_side import ENV, LlamaServerConfig, LlamaServerNotFound, find_llama_server
from sealed_bench.peers import llama_cpp_peer

ROOT = Path(__file__).resolve().parents[2]


def _config(**kw: object) -> LlamaServerConfig:
    base: dict[str, object] = {"binary": Path("/opt/llama-server"), "gguf": Path("/m/model-Q8_0.gguf"),
                               "served_name": "m", "port": 8123, "threads": 2}
    return LlamaServerConfig(**{**base, **kw})  # type: ignore[arg-type]


def test_command_has_issue_49s_configuration() -> None:
    cmd = _config(parallel=16, tokens_per_slot=512).command()

    def value(flag: str) -> str:
        return cmd[cmd.index(flag) + 1]

    assert (value("--threads"), value("--threads-batch"), value("--parallel")) == ("2", "2", "16")
    assert value("--ctx-size") == str(16 * 512) and "--cont-batching" in cmd and "--no-kv-unified" in cmd
    assert (value("--model"), value("--alias"), value("--port")) == ("/m/model-Q8_0.gguf", "m", "8123")


def test_record_names_the_command_without_its_port() -> None:
    row = _config().record(llama_cpp_peer([0, 1], "Q8_0"))
    assert row["command"][0] == "llama-server" and "8123" not in row["command"]
    assert row["peer"] == "llama.cpp" and row["threads"] == 2 and row["ctx_size"] == 16 * 512


@pytest.mark.parametrize("field", ["threads", "parallel", "tokens_per_slot"])
def test_config_refuses_a_count_below_one(field: str) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        _config(**{field: 0})


def test_configured_binary_must_be_an_executable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tmp_path / "llama-server"
    plain.write_text("not a program")
    monkeypatch.setenv(ENV, str(plain))
    with pytest.raises(LlamaServerNotFound, match="not an executable"):
        find_llama_server()
    monkeypatch.setenv(ENV, str(tmp_path / "absent"))
    with pytest.raises(LlamaServerNotFound, match="not an executable"):
        find_llama_server()
    plain.chmod(plain.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(ENV, str(plain))
    assert find_llama_server() == plain


def test_llamaserve_refuses_a_model_dir_without_the_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "model-Q8_0.gguf").write_bytes(b"")
    with pytest.raises(SystemExit) as exc:
        llamaserve(["--model-dir", str(tmp_path), "--quant", "Q4_0"])
    assert exc.value.code == 2 and "no model-Q4_0.gguf" in capsys.readouterr().err


def test_llamaserve_refuses_a_count_below_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "model-Q8_0.gguf").write_bytes(b"")
    with pytest.raises(SystemExit) as exc:
        llamaserve(["--model-dir", str(tmp_path), "--pairs", "0"])
    assert exc.value.code == 2 and "must be >= 1" in capsys.readouterr().err


def test_up_refuses_an_unknown_gguf_quant_before_touching_its_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = subprocess.run([sys.executable, "-m", "api.cli.main", "up", "--home", str(home), "--gguf-quant", "int3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--gguf-quant must be fp32 or native" in proc.stderr
    assert not home.exists()


def _side(throughput: float, tpot: float, completed: bool) -> dict[str, float | None]:
    return {"median_output_throughput": throughput, "median_median_tpot_ms": tpot, "all_completed": completed}


@pytest.mark.parametrize(("sealed", "llama", "failed"), [
    (_side(40.0, 200.0, True), _side(37.0, 230.0, True), set()),
    (_side(30.0, 200.0, True), _side(37.0, 230.0, True), {"throughput_1_0x"}),
    (_side(40.0, 240.0, True), _side(37.0, 230.0, True), {"tpot_p50_no_higher"}),
    # llama-server dropped requests (slots too small): its throughput counts less work, nothing compares.
    (_side(40.0, 200.0, True), _side(37.0, 230.0, False), {"every_request_completed"}),
    (_side(40.0, 200.0, False), _side(37.0, 230.0, True), {"every_request_completed"}),
])
def test_targets_need_every_request_completed_on_both_sides(sealed: dict, llama: dict, failed: set[str]) -> None:
    from sealed_bench.bench_llamaserve import _targets

    checks = _targets({"sealed": sealed, "llama": llama})
    assert {name for name, ok in checks.items() if not ok} == failed
