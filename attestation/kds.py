"""AMD Key Distribution Service (KDS) collateral: VCEKs, cert chains and CRLs, with a disk cache.

URLs per the VCEK/KDS interface spec (AMD #57230):
  {base}/vcek/v1/{product}/{hwid}?blSPL=&teeSPL=&snpSPL=&ucodeSPL=[&fmcSPL=]   (DER)
  {base}/{vcek|vlek}/v1/{product}/cert_chain                                    (PEM: ASK/ASVK, ARK)
  {base}/{vcek|vlek}/v1/{product}/crl                                           (DER, ARK-signed)
Turin's hwid is the first 8 bytes of CHIP_ID. KDS rate-limits clients, so requests are spaced by
`min_interval_s` and a 429 is retried after its Retry-After. Clock and sleep are injected.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from attestation.errors import CollateralError
from attestation.snp.certs import VekKind
from attestation.snp.tcb import Product, TcbVersion

KDS_BASE = "https://kdsintf.amd.com"


@dataclass(frozen=True)
class KdsConfig:
    base_url: str = KDS_BASE
    cache_dir: Path | None = None
    offline: bool = False  # only pre-seeded cache entries; a miss raises CollateralError
    min_interval_s: float = 1.0
    max_retries: int = 3
    max_retry_after_s: float = 60.0
    timeout_s: float = 30.0


def vcek_path(product: Product, chip_id: bytes, tcb: TcbVersion) -> str:
    """KDS path (with query) of the VCEK for a chip at a TCB."""
    hwid = chip_id[:8] if product.fmc_layout else chip_id
    query = f"blSPL={tcb.bl}&teeSPL={tcb.tee}&snpSPL={tcb.snp}&ucodeSPL={tcb.ucode}"
    if product.fmc_layout:
        if tcb.fmc is None:
            raise CollateralError("a Turin VCEK request needs the FMC SPL")
        query += f"&fmcSPL={tcb.fmc}"
    return f"/vcek/v1/{product.value}/{hwid.hex()}?{query}"


def chain_path(product: Product, kind: VekKind) -> str:
    return f"/{kind.value}/v1/{product.value}/cert_chain"


def crl_path(product: Product, kind: VekKind) -> str:
    return f"/{kind.value}/v1/{product.value}/crl"


@dataclass
class _Pacer:
    """Client-side spacing of requests (mutable by nature; owned by one fetcher)."""

    clock: Callable[[], float]
    sleep: Callable[[float], None]
    last: float | None = None

    def wait(self, interval: float) -> None:
        if self.last is not None:
            delay = self.last + interval - self.clock()
            if delay > 0:
                self.sleep(delay)
        self.last = self.clock()


@dataclass(frozen=True)
class KdsFetcher:
    """Fetch and cache KDS collateral. Satisfies attestation.snp.verify.CollateralFetcher."""

    config: KdsConfig = field(default_factory=KdsConfig)
    transport: httpx.BaseTransport | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    _pacer: _Pacer = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_pacer", _Pacer(self.clock, self.sleep))

    def vcek(self, product: Product, chip_id: bytes, tcb: TcbVersion) -> bytes:
        return self.get(vcek_path(product, chip_id, tcb))

    def cert_chain(self, product: Product, kind: VekKind = VekKind.VCEK) -> bytes:
        return self.get(chain_path(product, kind))

    def crl(self, product: Product, kind: VekKind = VekKind.VCEK) -> bytes:
        # CRLs change; a cached one is still returned, and the verifier rejects it once expired.
        return self.get(crl_path(product, kind))

    def cache_file(self, path: str) -> Path | None:
        if self.config.cache_dir is None:
            return None
        readable = path.split("?", 1)[0].strip("/").replace("/", "_")
        digest = hashlib.sha256(path.encode()).hexdigest()[:16]  # the query (TCB) is part of the key
        return self.config.cache_dir / f"{readable}-{digest}"

    def seed(self, path: str, data: bytes) -> None:
        """Pre-seed the cache (offline bundles)."""
        target = self.cache_file(path)
        if target is None:
            raise CollateralError("no cache directory configured")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def get(self, path: str) -> bytes:
        cached = self.cache_file(path)
        if cached is not None and cached.is_file():
            return cached.read_bytes()
        if self.config.offline:
            raise CollateralError(f"offline and not cached: {path}")
        data = self._download(path)
        if cached is not None:
            self.seed(path, data)
        return data

    def _download(self, path: str) -> bytes:
        url = self.config.base_url.rstrip("/") + path
        with httpx.Client(transport=self.transport, timeout=self.config.timeout_s) as client:
            for _ in range(self.config.max_retries + 1):
                self._pacer.wait(self.config.min_interval_s)
                try:
                    resp = client.get(url)
                except httpx.HTTPError as exc:
                    raise CollateralError(f"KDS request {url} failed: {exc}") from exc
                if resp.status_code == 429:
                    self.sleep(self._retry_after(resp))
                    continue
                if resp.status_code != 200:
                    raise CollateralError(f"KDS {url} answered HTTP {resp.status_code}")
                if not resp.content:
                    raise CollateralError(f"KDS {url} returned an empty body")
                return resp.content
        raise CollateralError(f"KDS {url} still rate-limited after {self.config.max_retries} retries")

    def _retry_after(self, resp: httpx.Response) -> float:
        value = resp.headers.get("Retry-After", "")
        try:
            delay = float(value)
        except ValueError:
            delay = self.config.min_interval_s * 5  # HTTP-date or missing: back off conservatively
        if delay > self.config.max_retry_after_s:
            raise CollateralError(f"KDS asks to retry after {delay:.0f}s, more than allowed")
        return max(delay, 0.0)
