"""Crash safety: kill -9 a process that is appending; the log must still verify and reopen."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policy.audit import AuditLog, verify_log

WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from policy.audit import AuditLog

    key = load_pem_private_key(Path(sys.argv[2]).read_bytes(), None)
    log = AuditLog(Path(sys.argv[1]), key, "worker", fsync="batch", batch_max=64, checkpoint_every=50)
    n = 0
    while True:
        for _ in range(20):
            log.append(tenant="acme", action="tool_call", decision="allow", metadata={"i": n})
            n += 1
        log.flush()
        print(n, flush=True)  # everything up to n is durable
    """
)


def test_kill_9_while_appending(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    key_file = tmp_path / "worker.pem"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    log_path = tmp_path / "worker.audit.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(log_path), str(key_file)],
                            stdout=subprocess.PIPE, text=True)
    durable = 0
    deadline = time.monotonic() + 30
    try:
        assert proc.stdout is not None
        while durable < 300 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            durable = int(line)
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # mid-append: the writer never stops between flushes
        proc.wait(timeout=10)
    assert durable >= 300, "writer did not make progress"
    keys = {"worker": key.public_key()}
    report = verify_log(log_path, keys)
    assert report.entries >= durable  # at most the unflushed tail is lost
    assert report.checkpoints >= 1
    # The writer can resume after the crash and the chain stays intact.
    with AuditLog(log_path, key, "worker") as log:
        log.append(tenant="acme", action="restart", decision="allow")
    assert verify_log(log_path, keys).entries == report.entries + 1
