"""The engine tuning file: what `sealed tune` measured best on one machine, for the tenant to measure into
a worker's configuration (`python -m enclave_worker --engine-tuning FILE`; docs/engine.md, "Tuning").

The worker never times anything itself (no calibration at boot, no live tuner): two workers with the same
measurement run the same kernels on the same thread count, so they give the same logits. The file's
values become `WorkerSettings` fields, which the measured configuration lists, so the tenant's release
policy fixes them: an operator who edits the file changes the measurement and gets no key.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from enclave_worker.engine.config import DECODE_KERNELS
from enclave_worker.engine.kernel_path import CPU_CLASSES

FORMAT = "sealed-engine-tuning-v1"
MAX_THREADS = 1024  # far beyond any CPU a worker runs on: a larger count is a typo or an attack


class TuningFileInvalid(ValueError):
    """The tuning file is unreadable, of another format, or holds a value the engine would not take."""


@dataclass(frozen=True)
class EngineTuning:
    cpu_class: str  # the class it was measured on (engine/kernel_path.py); the worker must be of it
    num_threads: int  # the engine's fixed intra-op thread count
    decode_kernels: str  # EngineConfig.decode_kernels: "auto" (the C++ CPU kernels) or "torch"

    def __post_init__(self) -> None:
        if self.cpu_class not in CPU_CLASSES:
            raise TuningFileInvalid(f"cpu_class must be one of {CPU_CLASSES}, not {self.cpu_class!r}")
        if type(self.num_threads) is not int or not 1 <= self.num_threads <= MAX_THREADS:
            raise TuningFileInvalid(f"num_threads must be an int in 1..{MAX_THREADS}, not {self.num_threads!r}")
        if self.decode_kernels not in DECODE_KERNELS or self.decode_kernels == "triton":
            raise TuningFileInvalid(f"decode_kernels must be 'auto' or 'torch', not {self.decode_kernels!r}")

    def to_json(self, measured: dict[str, Any] | None = None) -> str:
        """The file's text; `measured` (what each candidate did) is kept for people and ignored on read."""
        return json.dumps({"format": FORMAT, **asdict(self), **({"measured": measured} if measured else {})},
                          indent=1, sort_keys=True) + "\n"


def load_tuning(path: Path) -> EngineTuning:
    """The tuning in `path`, every value checked (raises TuningFileInvalid, or OSError when unreadable)."""
    try:
        doc = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TuningFileInvalid(f"{path.name}: not JSON ({exc.__class__.__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TuningFileInvalid(f"{path.name}: not a {FORMAT} document")
    unknown = set(doc) - {"format", "measured", "cpu_class", "num_threads", "decode_kernels"}
    if unknown:
        raise TuningFileInvalid(f"{path.name}: unknown fields {sorted(unknown)}")
    missing = {"cpu_class", "num_threads", "decode_kernels"} - set(doc)
    if missing:
        raise TuningFileInvalid(f"{path.name}: missing fields {sorted(missing)}")
    return EngineTuning(cpu_class=doc["cpu_class"], num_threads=doc["num_threads"],
                        decode_kernels=doc["decode_kernels"])
