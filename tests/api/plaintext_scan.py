"""The plaintext-weight scanner: needles (bytes of known tensors) searched in files, in what a
process has open, and in a process's memory. Used by the stack security tests of both engines."""

from __future__ import annotations

import os
import re
from pathlib import Path

from api.tenant_tools import default_model_path
from enclave_worker.engine.checkpoint import load_gguf

NEEDLE_TENSORS = ("model.layers.0.self_attn.q_proj.weight", "model.layers.7.mlp.down_proj.weight",
                  "model.norm.weight")


def weight_needles() -> list[bytes]:
    """64 bytes from the middle of known tensors as a worker holds them (fp32; vLLM fuses q/k/v
    but keeps each row's bytes; the bf16 embedding table) and from the middle of the GGUF file."""
    checkpoint = load_gguf(default_model_path())
    needles = []
    for name in NEEDLE_TENSORS:
        raw = checkpoint.tensors[name].contiguous().numpy().tobytes()
        middle = len(raw) // 2
        needles.append(raw[middle: middle + 64])
    # As the CPU engine holds fp32 layers by default: in column panels [N / NR, K, NR] (layers/panel.py),
    # where 64 bytes are one column of NR rows at consecutive k. q_proj's rows lead the fused QKV.
    from enclave_worker.engine.kernels.cpu_ops import load_cpu_ops

    nr = int(load_cpu_ops().panel_width())
    q = checkpoint.tensors["model.layers.0.self_attn.q_proj.weight"].float()
    p, k = q.shape[0] // nr // 2, q.shape[1] // 2
    column_run = q[p * nr:(p + 1) * nr, k:k + 64 // (4 * nr)].t().contiguous()  # [k, NR]: the panel's order
    needles.append(column_run.numpy().tobytes())
    # As a bf16 worker holds them too (the CPU default where the CPU computes bf16): the embedding
    # table's rows stay plain bf16 (the packed weights are in oneDNN's blocked layout).
    import torch

    raw = checkpoint.tensors["model.embed_tokens.weight"].to(torch.bfloat16).contiguous().view(torch.uint8).reshape(-1)
    middle = raw.numel() // 2
    needles.append(raw[middle: middle + 64].numpy().tobytes())
    gguf = default_model_path().read_bytes()
    needles.append(gguf[len(gguf) // 2: len(gguf) // 2 + 64])
    return needles


def files_with_needles(paths: list[Path], needles: list[bytes]) -> list[str]:
    found = []
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError:
            continue  # gone since it was listed
        found += [str(path) for needle in needles if needle in data]
    return found


def open_files(pid: int) -> list[Path]:
    """What `pid` has open that has bytes to read: regular files, deleted ones and memfds included
    (read through /proc/PID/fd, which works for all of them); sockets, pipes and devices are not files."""
    out = []
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(("socket:", "pipe:", "anon_inode:", "/dev/")):
            continue
        out.append(fd)
    return out


def memory_with_needles(pid: int, needles: list[bytes]) -> list[str]:
    """Mappings of `pid`'s memory (readable, private or anonymous) that hold a needle (needs ptrace
    rights over the process: the test runs as its parent's user)."""
    found = []
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            addresses, perms = fields[0], fields[1]
            path = fields[5] if len(fields) > 5 else ""
            if "r" not in perms or path.startswith("[v") or (path and not path.startswith("[")
                                                              and re.search(r"\.(so|py|pyc)", path)):
                continue
            start, end = (int(x, 16) for x in addresses.split("-"))
            overlap = max(len(n) for n in needles) - 1
            position, tail = start, b""
            while position < end:
                try:
                    mem.seek(position)
                    chunk = tail + mem.read(min(_CHUNK, end - position))
                except (OSError, ValueError, OverflowError):
                    break
                found += [f"{addresses} {path}" for needle in needles if needle in chunk]
                position += _CHUNK
                tail = chunk[-overlap:]
    return found


_CHUNK = 64 << 20
