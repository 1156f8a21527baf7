"""The key broker refuses to start unless it runs what its init-data says (key_broker/workload_check.py):
one line on stderr, exit code EXIT_CONFIG_ERROR, before any key is made or opened. And a worker's
init-data never passes as a broker's (attestation/broker_initdata.py, attestation/coco_initdata.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from attestation.broker_initdata import BrokerInitData
from attestation.coco_initdata import render
from attestation.errors import ParseError
from attestation.initdata import InitData
from attestation.launch_env import process_environ
from key_broker.__main__ import main, parse, settings_from
from key_broker.workload_check import broker_init_data_for, measured_env
from protocol.exit_codes import EXIT_CONFIG_ERROR

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "registry.example.com/sealed/broker@sha256:" + "bc" * 32
POLICY = "package agent_policy\ndefault CreateContainerRequest := false\n"


def _argv(tmp: Path, *extra: str) -> list[str]:
    return ["--data-dir", str(tmp / "data"), "--tee", "snp", "--keystore", "local", *extra]


def _declared(tmp: Path) -> BrokerInitData:
    argv = _argv(tmp)
    return broker_init_data_for(IMAGE, argv, process_environ(), settings_from(parse(argv), {}))


def _refusal(tmp: Path, argv: list[str], document: bytes | None, capsys: pytest.CaptureFixture[str]) -> str:
    if document is not None:
        (tmp / "init-data").write_bytes(document)
        argv = [*argv, "--init-data", str(tmp / "init-data")]
    assert main(argv) == EXIT_CONFIG_ERROR
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("key-broker: refusing to start: WorkloadMismatch: "), err
    assert not (tmp / "data").exists(), "no key was made before the check"
    return err


def _worker_document() -> InitData:
    return InitData(image=IMAGE, argv=("--tee", "snp"), agent_policy_digest="")


CASES = {
    "a-changed-argument": (lambda t: _argv(t, "--rate-limit-per-minute", "5"), "arguments differ"),
    "an-unsafe-switch": (lambda t: _argv(t, "--unsafe-dev-mode"), "arguments differ"),
    "another-key-store": (lambda t: ["--data-dir", str(t / "data"), "--tee", "snp", "--keystore", "vault",
                                     "--vault-url", "https://bao.example"], "arguments differ"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_arguments_its_init_data_does_not_name_are_refused(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    argv, reason = CASES[case]
    monkeypatch.setenv("SEALED_VAULT_TOKEN", secrets.token_urlsafe(32))  # the vault row needs one (not measured)
    assert reason in _refusal(tmp_path, argv(tmp_path), _declared(tmp_path).encode(), capsys)


def test_a_changed_environment_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = _declared(tmp_path)
    changed = dataclasses.replace(document, env={**measured_env(process_environ()), "PYTHONHASHSEED": "7"})
    assert "environment differs" in _refusal(tmp_path, _argv(tmp_path), changed.encode(), capsys)


def test_no_init_data_on_hardware_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "no --init-data" in _refusal(tmp_path, _argv(tmp_path), None, capsys)


def test_a_workers_init_data_is_not_a_brokers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    worker = _worker_document()
    assert "names a worker" in _refusal(tmp_path, _argv(tmp_path), worker.encode(), capsys)
    toml = render(dataclasses.replace(worker, agent_policy_digest=_digest(POLICY)), POLICY).text.encode()
    assert "carries no sealed-broker.json" in _refusal(tmp_path, _argv(tmp_path), toml, capsys)
    with pytest.raises(ParseError):
        BrokerInitData.decode(worker.encode())
    with pytest.raises(ParseError):
        InitData.decode(_declared(tmp_path).encode())


def test_one_toml_never_names_both_roles(tmp_path: Path) -> None:
    from attestation.coco_initdata import CocoInitData
    from attestation.errors import WorkloadMismatch

    broker = dataclasses.replace(_declared(tmp_path), agent_policy_digest=_digest(POLICY))
    text = render(broker, POLICY).text
    both = text + f'"sealed-worker.json" = {json.dumps(_worker_document().encode().decode())}\n'
    with pytest.raises(WorkloadMismatch, match="both"):
        CocoInitData.parse(both).broker()
    assert CocoInitData.parse(text).broker() == broker


def test_the_broker_process_exits_with_one_line(tmp_path: Path) -> None:
    """The real `python -m key_broker` on SNP without init-data: exit code 3, one line, no traceback."""
    run = subprocess.run([sys.executable, "-m", "key_broker", *_argv(tmp_path)], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == EXIT_CONFIG_ERROR, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1].startswith("key-broker: refusing to start: WorkloadMismatch: no "
                                                          "--init-data"), run.stderr
    assert "Traceback" not in run.stderr


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()
