"""Detection reports what a machine has and why the rest is unavailable."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from attestation.detect import detect


def _nvml(cc: int = 1, devtools: int = 0, fail: bool = False):  # type: ignore[no-untyped-def]
    class Fake:
        def nvmlInit(self) -> None:
            if fail:
                raise RuntimeError("no driver")

        def nvmlSystemGetConfComputeState(self):  # type: ignore[no-untyped-def]
            return SimpleNamespace(ccFeature=cc, devToolsMode=devtools)

        def nvmlShutdown(self) -> None:
            pass

    return lambda: Fake()


def _by_tee(caps):  # type: ignore[no-untyped-def]
    return {c.tee: c for c in caps}


def test_plain_vm_has_only_the_simulated_tee(tmp_path: Path) -> None:
    (tmp_path / "cpuinfo").write_text("flags\t: fpu sse avx2\n")
    caps = _by_tee(detect(tsm=tmp_path / "none", sev_guest=tmp_path / "x", tdx_guest=tmp_path / "y",
                          cpuinfo=tmp_path / "cpuinfo", load_nvml=_nvml(fail=True)))
    assert not caps["snp"].available and "sev_snp" in caps["snp"].reason
    assert not caps["tdx"].available and not caps["nvgpu"].available
    assert caps["sim"].available and "INSECURE" in caps["sim"].reason


def test_snp_guest_with_cc_gpu(tmp_path: Path) -> None:
    (tmp_path / "tsm").mkdir()
    (tmp_path / "sev-guest").write_bytes(b"")
    (tmp_path / "cpuinfo").write_text("flags\t: fpu sev_snp\n")
    caps = _by_tee(detect(tsm=tmp_path / "tsm", sev_guest=tmp_path / "sev-guest", tdx_guest=tmp_path / "y",
                          cpuinfo=tmp_path / "cpuinfo", load_nvml=_nvml()))
    assert caps["snp"].available and caps["nvgpu"].available and not caps["tdx"].available


def test_gpu_in_devtools_mode_or_cc_off_is_unavailable(tmp_path: Path) -> None:
    for nvml, needle in ((_nvml(devtools=1), "devtools"), (_nvml(cc=0), "off")):
        caps = _by_tee(detect(tsm=tmp_path / "n", sev_guest=tmp_path / "n", tdx_guest=tmp_path / "n",
                              cpuinfo=tmp_path / "n", load_nvml=nvml))
        assert not caps["nvgpu"].available and needle in caps["nvgpu"].reason


def test_this_machine() -> None:
    caps = _by_tee(detect())
    assert caps["sim"].available
    assert all(c.reason for c in caps.values())
