"""Run the real worker (enclave_worker.grpc_server) on fake TEE hardware, for the end-to-end tests.

`python -m tests.enclave_worker.fake_tee_worker --platform DIR --cpu snp|tdx [--sev-guest-ioctl]
 [--nvml cc-on|cc-on-tampered|cc-off|none] [--launch-init-data FILE] [--kernel-cmdline-append ARG]
 WORKER-ARGS...`

`--kernel-cmdline-append`: the TD boots the captured CCEL's kernel with one more kernel argument
(the log's command-line event and so RTMR2 change); `--nvml cc-on-tampered`: GPUs in CC mode whose
VBIOS measures other than NVIDIA's RIM for its version holds (devtools/sealed_fakes/gpu_collateral.py).

The fake guest is launched with init-data (attestation/initdata.py), as a host does: the fake SNP
reports its SHA-256 as HOST_DATA, the fake TD its SHA-384 as MRCONFIGID; a CoCo init-data TOML (or
a pod's cc_init_data annotation value) given with --launch-init-data is launched as Kata's runtime
does (attestation/coco_initdata.py: the TOML's digest). Without
--launch-init-data the harness writes the document for the worker's own arguments, environment
and settings (what `sealed measure` computes), and passes it to the worker with --init-data
unless the worker's arguments name one.

The fakes sit where the hardware's interfaces are, inside this process: a configfs-tsm tree
answered by a thread (sealed_fakes.fake_tsm), or the /dev/sev-guest ioctl
(fake_sev_guest), and the `pynvml` module (fake_nvml). The worker's code is unchanged: it is
pointed at the fake tree with its ordinary --tsm-dir/--tsm-entry/--sev-guest-device options.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from attestation.coco_initdata import host_digest
from attestation.initdata import InitData
from attestation.snp.collect import encode_cert_table
from enclave_worker.workload_check import init_data_for, process_environ
from sealed_fakes.ccel import kernel_cmdline, with_kernel_cmdline
from sealed_fakes.fake_nvml import FakeNvml
from sealed_fakes.fake_sev_guest import FakeSevGuest
from sealed_fakes.fake_tsm import FakeTsmTree
from sealed_fakes.gpu_collateral import tampered_measurements
from sealed_fakes.platform import FakePlatform, gpu_report

TEST_IMAGE = "sealed-worker@sha256:" + "ab" * 32
VECTORS = Path(__file__).resolve().parents[1] / "vectors"
H200_CC_OFF = VECTORS / "nvml" / "h200_cc_off_20261130.json"
CCEL = VECTORS / "tdx-ccel"


def launch_init_data(path: Path | None, worker_argv: list[str]) -> InitData:
    """The init-data the fake guest is launched with: the file given, or the worker's own."""
    if path is not None:
        return InitData.decode(path.read_bytes())
    from enclave_worker.cli import parse

    _, settings = parse(worker_argv)
    return init_data_for(TEST_IMAGE, worker_argv, process_environ(), settings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fake_tee_worker", allow_abbrev=False)
    parser.add_argument("--platform", type=Path, required=True)
    parser.add_argument("--cpu", choices=("snp", "tdx"), required=True)
    parser.add_argument("--sev-guest-ioctl", action="store_true", help="SNP through the ioctl, no configfs-tsm")
    parser.add_argument("--nvml", choices=("cc-on", "cc-on-tampered", "cc-off", "none"), default="none")
    parser.add_argument("--kernel-cmdline-append", default=None)
    parser.add_argument("--launch-init-data", type=Path, default=None)
    ours, worker_argv = parser.parse_known_args(argv)
    platform = FakePlatform.load(ours.platform)
    run = ours.platform / f"hw-{os.getpid()}"
    extra: list[str] = []
    if ours.launch_init_data is not None:
        raw = ours.launch_init_data.read_bytes()
    else:
        raw = launch_init_data(None, worker_argv).encode()
    if "--init-data" not in worker_argv and not any(a.startswith("--init-data=") for a in worker_argv):
        path = run / "init-data"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(raw)
        extra += ["--init-data", str(path)]
    host_data, mr_config_id = host_digest(raw, "snp"), host_digest(raw, "tdx")
    if ours.cpu == "snp":
        table = encode_cert_table({"vcek": platform.vcek})
        if ours.sev_guest_ioctl:
            device = FakeSevGuest(run / "dev" / "sev-guest",
                                  lambda d, vmpl: platform.snp_report(d, vmpl, host_data=host_data), table)
            device.install()
            extra += ["--tsm-dir", str(run / "no-configfs"), "--sev-guest-device", str(device.device)]
        else:
            FakeTsmTree(run / "tsm", "sev_guest",
                        lambda d, vmpl: (platform.snp_report(d, vmpl, host_data=host_data), table)).start()
            extra += ["--tsm-dir", str(run / "tsm"), "--tsm-entry", "sealed",
                      "--sev-guest-device", str(run / "no-sev-guest")]
    else:
        # The firmware's CC event log: a real capture (tests/vectors/tdx-ccel); the fake TD's RTMRs
        # are what it replays to.
        log, log_file = (CCEL / "ccel_data.dat").read_bytes(), CCEL / "ccel_data.dat"
        if ours.kernel_cmdline_append:
            log = with_kernel_cmdline(log, f"{kernel_cmdline(log)} {ours.kernel_cmdline_append}")
            log_file = run / "ccel_data.dat"
            log_file.parent.mkdir(parents=True, exist_ok=True)
            log_file.write_bytes(log)
        FakeTsmTree(run / "tsm", "tdx_guest",
                    lambda d, _: (platform.tdx_quote(d, log, mr_config_id=mr_config_id), None)).start()
        extra += ["--tsm-dir", str(run / "tsm"), "--tsm-entry", "sealed",
                  "--ccel-table", str(CCEL / "ccel_table.dat"), "--ccel-data", str(log_file)]
    if ours.nvml == "cc-on":
        FakeNvml.cc_on(platform.gpus, gpu_report).install()
    elif ours.nvml == "cc-on-tampered":
        FakeNvml.cc_on(platform.gpus, lambda g, i, nonce: gpu_report(g, i, nonce, tampered_measurements())).install()
    elif ours.nvml == "cc-off":
        FakeNvml.from_capture(H200_CC_OFF).install()
    from enclave_worker.grpc_server import main as worker_main

    # The worker's own options come last: a test's --tee and friends override these defaults.
    return worker_main([*extra, *worker_argv])


if __name__ == "__main__":
    sys.exit(main())
