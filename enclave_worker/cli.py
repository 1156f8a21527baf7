"""The worker process's command line: `python -m enclave_worker ...` (or, as before,
`python -m enclave_worker.grpc_server ...`). Parses the flags into `WorkerSettings`, prepares the
process (logging, the engine's threads, the heap), and serves (`enclave_worker/serve.py`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from attestation.attesters import resolve_tee
from attestation.errors import AttestationError, UnsupportedError
from enclave_worker.engine_tuning import EngineTuning, load_tuning
from enclave_worker.serve import serve
from enclave_worker.settings import WorkerSettings
from enclave_worker.tee import check_workload
from enclave_worker.workload_check import process_environ
from protocol.asgi import freeze_startup_heap, schedule_full_collections
from protocol.exit_codes import EXIT_CONFIG_ERROR


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m enclave_worker")
    parser.add_argument("--broker-url", required=True)
    parser.add_argument("--package-dir", type=Path, required=True)
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--tee", default="sim",
                        help="sim | snp | tdx | auto, optionally +nvgpu (GPUs in CC mode), e.g. snp+nvgpu")
    parser.add_argument("--tsm-dir", type=Path, default=Path("/sys/kernel/config/tsm/report"),
                        help="configfs-tsm report directory")
    parser.add_argument("--tsm-entry", default=None, help="use this existing configfs-tsm entry")
    parser.add_argument("--sev-guest-device", type=Path, default=Path("/dev/sev-guest"))
    parser.add_argument("--ccel-table", type=Path, default=Path("/sys/firmware/acpi/tables/CCEL"),
                        help="ACPI CCEL table (TDX CC event log)")
    parser.add_argument("--ccel-data", type=Path, default=Path("/sys/firmware/acpi/tables/data/CCEL"))
    parser.add_argument("--sim-platform-key", type=Path, default=os.environ.get("SEALED_SIM_PLATFORM_KEY") or None,
                        help="simulated TEE's key (dev; default $SEALED_SIM_PLATFORM_KEY)")
    parser.add_argument("--unsafe-sim-measurement", default=None)
    parser.add_argument("--broker-tee", choices=("sim", "snp", "tdx"), default=None,
                        help="the key broker's TEE (measured)")
    parser.add_argument("--broker-measurement", action="append", default=[],
                        help="a key broker measurement (hex) this worker trusts (measured; repeatable)")
    parser.add_argument("--broker-instance", action="append", default=[],
                        help="the key broker instance key (hex, from its identity) this worker accepts (#46)")
    parser.add_argument("--broker-workload-id", action="append", default=[],
                        help="the key broker's workload id (hex: the digest of its init-data, SNP HOST_DATA / TDX "
                             "MRCONFIGID) this worker trusts (measured; repeatable; snp and tdx brokers only)")
    parser.add_argument("--unsafe-unauthenticated-broker", action="store_true",
                        help="trust the key broker without verifying its evidence (measured; logs a warning)")
    parser.add_argument("--host", default="127.0.0.1")
    # In a pod the address comes from the downward API ($POD_IP) rather than an argument: a Kata
    # pod's arguments are pinned in its agent policy and init-data, and the pod IP is known only later.
    parser.add_argument("--advertise-host", default=os.environ.get("POD_IP") or None,
                        help="address announced to the gateway (not measured; default $POD_IP, else --host)")
    parser.add_argument("--port", type=int, default=8002)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--register-url", action="append", default=[], help="gateway to send heartbeats to")
    parser.add_argument("--register-token-file", type=Path, default=None)
    parser.add_argument("--gateway-client-cert", type=Path, default=None,
                        help="serve gRPC over mutual TLS, accepting only this gateway certificate")
    parser.add_argument("--policy-file", type=Path, default=None, help="the tenant's signed policy set")
    parser.add_argument("--policy-admin-key", type=Path, default=None, help="tenant admin key that signed it")
    parser.add_argument("--min-policy-version", type=int, default=0,
                        help="refuse a tenant policy set older than this version (measured)")
    parser.add_argument("--min-release-policy-version", type=int, default=0,
                        help="refuse a key released under a tenant release policy older than this version "
                             "(measured; needs --policy-admin-key)")
    parser.add_argument("--init-data", type=Path, default=None,
                        help="the init-data document this guest was launched with (required on snp and tdx)")
    parser.add_argument("--unsafe-no-tenant-policy", action="store_true",
                        help="run without data and tool-use controls (logs a warning)")
    parser.add_argument("--lease-seconds", type=float, default=60.0,
                        help="serve at most this long without a key lease renewal (measured)")
    parser.add_argument("--lease-watch-seconds", type=float, default=20.0,
                        help="how long one lease renewal is held open at the broker")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                        help="where the engine runs; auto = cuda when a CUDA device is visible")
    parser.add_argument("--dtype", default=None, help="engine dtype (default: bfloat16 on cuda, float32 on cpu)")
    parser.add_argument("--cpu-class", default="auto",
                        help="CPU, engine sealed: the CPU class the kernels are chosen for (x86-avx512-bf16, "
                             "x86-avx512, x86-avx2, generic; measured as the kernel path); auto = this machine's. "
                             "Name it when measuring a worker for another machine")
    parser.add_argument("--engine-tuning", type=Path, default=None,
                        help="CPU, engine sealed: a `sealed tune` file (its CPU class, thread count and decode "
                             "kernels; measured). The worker must run on a CPU of the class it names")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                        help="share of GPU memory for weights, KV pool and activations")
    parser.add_argument("--stream-package", action="store_true",
                        help="CPU, sealed engine: authenticate the whole package, then decrypt each tensor when "
                             "the build takes it (lower peak memory, a second pass over the payload)")
    parser.add_argument("--standby", action="store_true",
                        help="a warm worker: boot and attest without a key, then wait for POST /internal/assign")
    parser.add_argument("--cpu-memory-utilization", type=float, default=None,
                        help="CPU: share of the memory the host (or cgroup) leaves the worker for weights, KV pool "
                             "and activations; the KV pool takes the rest (default: a fixed 256 MiB pool)")
    parser.add_argument("--engine", choices=("sealed", "vllm"), default="sealed",
                        help="the inference engine (measured); vllm needs vLLM installed in this interpreter")
    parser.add_argument("--vllm-cpu-bind", default="all",
                        help="engine vllm on the CPU: the CPUs vLLM computes on: all (every CPU the worker may use, "
                             "none reserved), auto (vLLM's default: one reserved for a frontend) or a list like "
                             "0-3 (measured)")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="tokens per engine step (default: 512 on the CPU, 2048 on a GPU)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--sealed-padding-min-bytes", type=int, default=256,
                        help="pad each sealed response chunk to a power-of-two size of at least this many "
                             "bytes (0: exact sizes, visible to the gateway; measured)")
    return parser


def parse(argv: list[str]) -> tuple[argparse.Namespace, WorkerSettings]:
    """The worker's options and settings for `argv` (exits with a usage error on bad input)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        tee, gpu_tee = resolve_tee(args.tee)
    except UnsupportedError as exc:
        parser.error(str(exc))
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    cpu_class = None if device != "cpu" or args.engine != "sealed" else args.cpu_class
    if cpu_class == "auto":
        from enclave_worker.engine.kernel_path import detect_cpu_class

        cpu_class = detect_cpu_class()
    try:
        tuning = _tuning(args.engine_tuning, cpu_class)
        return args, _settings(args, tee, gpu_tee, device, tuning.cpu_class if tuning else cpu_class, tuning)
    except (ValueError, OSError) as exc:  # TuningFileInvalid is a ValueError
        parser.error(str(exc))


def _tuning(path: Path | None, cpu_class: str | None) -> EngineTuning | None:
    """The `sealed tune` file, for the CPU class this worker runs its kernels for."""
    if path is None:
        return None
    if cpu_class is None:
        raise ValueError("--engine-tuning is for the sealed engine on the CPU")
    tuning = load_tuning(path)
    if tuning.cpu_class != cpu_class:
        raise ValueError(f"--engine-tuning was measured on a {tuning.cpu_class} CPU; this worker runs for {cpu_class}")
    return tuning


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args, settings = parse(argv)
    device = settings.device
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per heartbeat otherwise
    try:  # before anything is attested or fetched: this worker runs what its init-data says, or stops here
        check_workload(settings, argv, process_environ())
    except (AttestationError, OSError) as exc:
        print(f"worker: refusing to start: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG_ERROR  # restarting cannot help: the same arguments, the same init-data
    token = args.register_token_file.read_text().strip() if args.register_token_file else ""
    client_cert = args.gateway_client_cert.read_bytes() if args.gateway_client_cert else None
    if settings.engine != "vllm" and device == "cpu":
        from enclave_worker.engine.errors import CpuKernelsUnavailable
        from enclave_worker.engine.kernels.cpu_ops import load_cpu_ops
        from enclave_worker.engine.threads import single_threaded_caller

        try:  # before anything is attested or fetched: the CPU kernels were built at install time, or it stops here
            load_cpu_ops()
        except CpuKernelsUnavailable as exc:
            print(f"worker: {exc}", file=sys.stderr, flush=True)
            return EXIT_CONFIG_ERROR  # restarting cannot help: the supervisor stops and shows this line
        single_threaded_caller()  # the engine's own thread is the one that computes in parallel
    freeze_startup_heap()  # before any key or weight exists: full GC passes scan only what serving creates
    schedule_full_collections()  # and run on a timer, not every few seconds under load
    asyncio.run(serve(settings, args.grpc_port, args.register_url, token, client_cert, args.advertise_host))
    return 0


def _settings(args: argparse.Namespace, tee: str, gpu_tee: str | None, device: str,
              cpu_class: str | None, tuning: EngineTuning | None) -> WorkerSettings:
    return WorkerSettings(
        broker_url=args.broker_url, package_dir=args.package_dir, tenant=args.tenant, model=args.model,
        version=args.version, tee=tee, gpu_tee=gpu_tee, device=device, engine_dtype=args.dtype, cpu_class=cpu_class,
        gpu_memory_utilization=args.gpu_memory_utilization, cpu_memory_utilization=args.cpu_memory_utilization,
        standby=args.standby,
        stream_package=args.stream_package,
        tsm_dir=args.tsm_dir, tsm_entry=args.tsm_entry,
        sev_guest_device=args.sev_guest_device, ccel_table=args.ccel_table, ccel_data=args.ccel_data,
        sim_platform_key=args.sim_platform_key,
        unsafe_sim_measurement=args.unsafe_sim_measurement, broker_tee=args.broker_tee,
        broker_measurements=tuple(args.broker_measurement), broker_workload_ids=tuple(args.broker_workload_id),
        broker_instances=tuple(args.broker_instance),
        unsafe_unauthenticated_broker=args.unsafe_unauthenticated_broker, host=args.host, port=args.port,
        engine=args.engine, max_num_seqs=args.max_num_seqs, vllm_cpu_bind=args.vllm_cpu_bind,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        policy_file=args.policy_file,
        policy_admin_key=args.policy_admin_key, unsafe_no_tenant_policy=args.unsafe_no_tenant_policy,
        min_policy_version=args.min_policy_version, init_data=args.init_data,
        min_release_policy_version=args.min_release_policy_version,
        lease_s=args.lease_seconds, lease_watch_s=args.lease_watch_seconds,
        sealed_padding_min_bytes=args.sealed_padding_min_bytes,
        num_threads=tuning.num_threads if tuning else None,
        decode_kernels=tuning.decode_kernels if tuning else "auto")
