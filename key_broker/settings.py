"""Key broker settings: explicit, frozen, built by the caller (never at import)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BrokerSettings:
    data_dir: Path
    issuer: str = "sealed-key-broker"
    # Present only where simulated TEEs may attest (dev); policies must still allow them.
    sim_platform_public_key: Path | None = None
    roots_dir: Path | None = None
    master_key_file: Path | None = None
    challenge_ttl: dt.timedelta = dt.timedelta(seconds=60)
    token_ttl: dt.timedelta = dt.timedelta(minutes=5)
    max_body_bytes: int = 1 << 20
