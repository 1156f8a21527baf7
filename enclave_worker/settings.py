"""Worker settings: frozen, explicit, and part of the measured configuration."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enclave_worker.vllm_cpu_binding import CpuBindingError, VllmCpuBinding
from protocol.model_ref import ModelRef
from protocol.sealed.padding import PaddingPolicy


@dataclass(frozen=True)
class WorkerSettings:
    broker_url: str
    package_dir: Path
    tenant: str
    model: str
    version: str
    tee: str = "sim"  # the CPU TEE: sim | snp | tdx (resolved from `auto` before settings are built)
    gpu_tee: str | None = None  # "nvgpu": NVIDIA GPUs in CC mode attested beside the CPU
    sim_platform_key: Path | None = None  # the simulated TEE's signing key (sim only)
    # Replaces the computed simulated measurement (tests of a worker the policy does not allow).
    unsafe_sim_measurement: str | None = None
    # The key broker this worker trusts (measured, so the tenant's release policy fixes it too):
    # its TEE and measurement(s); the worker verifies the broker's evidence against them before it
    # trusts a key, a receipt or a lease answer (enclave_worker/broker_auth.py). Unpinned: no boot.
    broker_tee: str | None = None
    broker_measurements: tuple[str, ...] = ()
    # The broker's workload id(s): the digest of its init-data (image, arguments, configuration) its
    # SNP HOST_DATA / TDX MRCONFIGID carries (attestation/broker_initdata.py). Pinned, it is required;
    # the simulated TEE has none. Measured, so in this worker's own init-data.
    broker_workload_ids: tuple[str, ...] = ()
    # The broker instance(s) (the instance key its identity names, made at its initialisation; #46):
    # a broker initialised afresh (its state lost or rolled back) or a second copy of the build has
    # another and is refused. Measured, so the tenant's release policy fixes it too.
    broker_instances: tuple[str, ...] = ()
    # Trust whatever answers at broker_url (tests of other parts only; measured, logs a warning).
    unsafe_unauthenticated_broker: bool = False
    host: str = "127.0.0.1"
    port: int = 8002
    max_num_seqs: int = 16
    max_model_len: int = 2048
    # Tokens one engine step may compute (prefill chunks + decodes); None: 512 on the CPU, 2048 on a GPU.
    # On two CPU cores 16 prompts arriving together (`vllm bench serve` at concurrency 16) took 2 s
    # as one 2048-token step, so every one of them waited 2 s for a first token, and they then ended
    # together and the next 16 arrived together again. In 512-token chunks the first ones answer after a
    # quarter of that, the streams drift apart, and a later prompt is prefilled beside the decodes.
    max_num_batched_tokens: int | None = None
    # On SIGTERM (scale-in, rollout): streams in flight get this long to finish before the engine
    # stops; below the control loop's stop timeout (25 s) and the pod's terminationGracePeriodSeconds (60 s).
    drain_s: float = 20.0
    kv_cache_memory_bytes: int = 256 << 20  # CPU; on a GPU the pool is sized by gpu_memory_utilization
    # The vector stores an embedding model's worker keeps open (enclave_worker/retrieval/store_cache.py),
    # by their sealed snapshots' bytes. Not measured: it changes how often a snapshot is sent, not
    # what any answer can be (a store is served only at the exact snapshot the gateway names).
    store_cache_bytes: int = 1 << 30
    device: str = "cpu"  # cpu | cuda (resolved from `auto` before settings are built)
    engine: str = "sealed"  # sealed (ours) | vllm (docs/vllm-backend.md); measured
    # CPU, engine vllm: the CPUs vLLM computes on (enclave_worker/vllm_cpu_binding.py): "all" (every
    # CPU the worker may use, none reserved), "auto" (vLLM's default: one core of two kept for a
    # frontend the worker does not run) or a CPU list "0-3". Measured: it changes how the engine runs.
    vllm_cpu_bind: str = "all"
    engine_dtype: str | None = None  # None: bfloat16 on a GPU, float32 on the CPU
    # CPU, engine sealed: the CPU class the engine's kernels are chosen for (engine/kernel_path.py);
    # None: this machine's. The kernel path it gives is measured (engine.kernel), and the engine refuses
    # to build on a CPU of another class, so a worker runs the kernels its measurement names.
    cpu_class: str | None = None
    # CPU, engine sealed, from a `sealed tune` file (enclave_worker/engine_tuning.py), both measured: the
    # engine's fixed thread count (None: every CPU the worker may use, which a measurement does not
    # fix: name it wherever two workers must agree to the bit) and its decode kernels ("torch": no C++).
    num_threads: int | None = None
    decode_kernels: str = "auto"
    gpu_memory_utilization: float = 0.9  # share of GPU memory for weights + KV pool + activations
    # CPU: share of the host's (or cgroup's) memory for weights + KV pool + activations; None: the fixed
    # kv_cache_memory_bytes pool (engine/memory.py).
    cpu_memory_utilization: float | None = None
    # A warm worker: boot and attest without a key, then wait for POST /internal/assign (standby.py).
    # Not measured: it changes when the key is asked for, not what runs or what the evidence binds.
    standby: bool = False
    # CPU, sealed engine: the package is authenticated whole, then each tensor decrypted when the build
    # takes it (package/stream.py): the load's peak is the weights as built plus about a layer. Not in
    # measured_config (the same code and weights, checked the same; only when they are decrypted); the
    # flag is in the argv the init-data binds, as every option not in WORKER_UNMEASURED_OPTIONS.
    stream_package: bool = False
    policy_file: Path | None = None  # the tenant's signed policy set (data and tool-use controls)
    policy_admin_key: Path | None = None  # Ed25519 public key that must have signed it (measured)
    unsafe_no_tenant_policy: bool = False
    # The oldest tenant-signed policy set (its `version`) this worker accepts: an operator cannot roll
    # back to an older one (a weaker PII rule, require_sealed off). Measured, and in the init-data.
    min_policy_version: int = 0
    # The oldest tenant-signed *release* policy (its `version`) the worker accepts its key under: a
    # broker's sealed state can be rolled back by the operator to an older, laxer policy. Measured.
    min_release_policy_version: int = 0
    # The init-data document the host launched this guest with (attestation/initdata.py); its digest
    # is in every hardware report. The path is not measured, the document is.
    init_data: Path | None = None
    # Sealed answers: each response chunk padded to a power-of-two bucket of at least this many bytes
    # (protocol/sealed/padding.py; 0: exact sizes, which the gateway then sees). Measured.
    sealed_padding_min_bytes: int = 256
    # The key lease (docs/security.md, "Revocation"): without a renewal for lease_s the worker
    # wipes and stops serving; a renewal is held open at the broker for up to lease_watch_s.
    lease_s: float = 60.0
    lease_watch_s: float = 20.0
    # Where the guest kernel's attestation interfaces are (not measured: evidence is signed by the
    # TEE whatever path it came through).
    tsm_dir: Path = Path("/sys/kernel/config/tsm/report")
    tsm_entry: str | None = None
    sev_guest_device: Path = Path("/dev/sev-guest")
    ccel_table: Path = Path("/sys/firmware/acpi/tables/CCEL")
    ccel_data: Path = Path("/sys/firmware/acpi/tables/data/CCEL")

    def __post_init__(self) -> None:
        if self.broker_tee not in (None, "sim", "snp", "tdx"):
            raise ValueError(f"broker_tee must be sim, snp or tdx, not {self.broker_tee!r}")
        if self.broker_measurements and self.broker_tee is None:
            raise ValueError("broker_measurements need broker_tee")
        if self.broker_workload_ids and self.broker_tee not in ("snp", "tdx"):
            raise ValueError("broker_workload_ids need broker_tee snp or tdx: the simulated TEE carries no "
                             "init-data digest, so a simulated broker has no workload id")
        if self.engine not in ("sealed", "vllm"):
            raise ValueError(f"engine must be 'sealed' or 'vllm', not {self.engine!r}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            # None picks the device's default; 0 must not silently mean the same.
            raise ValueError(f"max_num_batched_tokens must be >= 1, not {self.max_num_batched_tokens}")
        self.vllm_cpu_binding  # noqa: B018 - a malformed CPU list is refused here, not when vLLM starts
        if type(self.min_policy_version) is not int or self.min_policy_version < 0:
            raise ValueError(f"min_policy_version must be a non-negative int, not {self.min_policy_version!r}")
        if type(self.min_release_policy_version) is not int or self.min_release_policy_version < 0:
            raise ValueError("min_release_policy_version must be a non-negative int, "
                             f"not {self.min_release_policy_version!r}")
        if self.min_release_policy_version and self.policy_admin_key is None:
            # The floor is checked on the tenant-signed envelope, which needs the tenant's key.
            raise ValueError("min_release_policy_version needs policy_admin_key")
        self.response_padding  # noqa: B018 - a bad padding size is refused here, not on the first request
        for name in ("gpu_memory_utilization", "cpu_memory_utilization"):
            fraction = getattr(self, name)
            if fraction is not None and not 0 < fraction <= 1:
                raise ValueError(f"{name} must be in (0, 1], not {fraction!r}")
        if self.cpu_class is not None:
            from enclave_worker.engine.kernel_path import CPU_CLASSES

            if self.cpu_class not in CPU_CLASSES:
                raise ValueError(f"cpu_class must be one of {CPU_CLASSES}, not {self.cpu_class!r}")
        if self.num_threads is not None and (type(self.num_threads) is not int or self.num_threads < 1):
            raise ValueError(f"num_threads must be a positive int or None, not {self.num_threads!r}")
        if type(self.store_cache_bytes) is not int or self.store_cache_bytes < 1:
            raise ValueError(f"store_cache_bytes must be a positive int, not {self.store_cache_bytes!r}")
        if self.decode_kernels not in ("auto", "torch"):
            raise ValueError(f"decode_kernels must be 'auto' or 'torch', not {self.decode_kernels!r}")

    @property
    def response_padding(self) -> PaddingPolicy:
        try:
            return PaddingPolicy(min_bytes=self.sealed_padding_min_bytes)
        except ValueError as exc:
            raise ValueError(f"sealed_padding_min_bytes: {exc}") from None

    @property
    def vllm_cpu_binding(self) -> VllmCpuBinding:
        try:
            return VllmCpuBinding(self.vllm_cpu_bind)
        except CpuBindingError as exc:
            raise ValueError(f"vllm_cpu_bind: {exc}") from None

    @property
    def ref(self) -> ModelRef:
        return ModelRef(self.tenant, self.model, self.version)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def insecure(self) -> bool:
        """Answers are not protected by hardware: the simulated TEE, or a GPU without attested CC
        (the worker serves on one only under the tenant's unsafe_allow_gpu_cc_off)."""
        return self.tee == "sim" or (self.on_gpu and self.gpu_tee is None)

    @property
    def step_token_budget(self) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 2048 if self.on_gpu else 512

    @property
    def dtype(self) -> str:
        return self.engine_dtype or ("bfloat16" if self.on_gpu else "float32")

    @property
    def kernel_path(self) -> str | None:
        """The name of the kernels our engine runs under these settings (engine/kernel_path.py): on the
        CPU, for ``cpu_class`` (this machine's when None); None for the vLLM engine."""
        if self.engine != "sealed":
            return None
        from enclave_worker.engine.kernel_path import choose_kernel_path, detect_cpu_class

        cpu_class = None if self.on_gpu else (self.cpu_class or detect_cpu_class())
        return choose_kernel_path(self.device, self.dtype, self.decode_kernels, cpu_class).name

    def promises(self) -> dict[str, Any]:
        """What this worker build promises about a client's data; measured, so a client can require it."""
        return {
            "prefix_cache_isolation": "per-tenant-salt",  # cache salt derived in the worker, per boot
            "prompts_logged": False,
            "prompts_retained": False,
            "sealed_mode": True,
            "data_controls": "none (unsafe)" if self.unsafe_no_tenant_policy else "signed-tenant-policy",
        }

    def broker_pin(self) -> dict[str, Any]:
        # A simulated broker is vouched for by whoever holds the simulated platform key: a worker
        # pinning one says so here (broker_tee "sim"), and the tenant's release policy sees it.
        return {"tee": self.broker_tee, "measurements": sorted(m.lower() for m in self.broker_measurements),
                # Listed only when set (measurements of workers that pin none stay as they were).
                **({"workload_ids": sorted(w.lower() for w in self.broker_workload_ids)}
                   if self.broker_workload_ids else {}),
                **({"instances": sorted(i.lower() for i in self.broker_instances)} if self.broker_instances else {})}

    def measured_config(self) -> dict[str, Any]:
        """The part of the configuration that changes what the worker does, hence its measurement."""
        return {
            "tenant": self.tenant,
            "model": self.model,
            "version": self.version,
            "tee": self.tee,
            "gpu_tee": self.gpu_tee,
            # Which tenant admin may set this worker's in-enclave policy is part of what is attested.
            "policy_admin_key": (hashlib.sha256(self.policy_admin_key.read_bytes()).hexdigest()
                                 if self.policy_admin_key else None),
            "unsafe_no_tenant_policy": self.unsafe_no_tenant_policy,
            # Listed only when set (measurements of workers without a floor stay as they were).
            **({"min_policy_version": self.min_policy_version} if self.min_policy_version else {}),
            **({"min_release_policy_version": self.min_release_policy_version}
               if self.min_release_policy_version else {}),
            "promises": self.promises(),
            # How long this worker may serve a key the broker no longer vouches for.
            "lease_s": self.lease_s,
            # What a gateway can learn from a sealed answer's frame sizes.
            "sealed_padding_min_bytes": self.sealed_padding_min_bytes,
            # Which key broker it trusts (listed only when set).
            **({"broker": self.broker_pin()} if self.broker_tee else {}),
            **({"unsafe_unauthenticated_broker": True} if self.unsafe_unauthenticated_broker else {}),
            "engine": {
                **({"kind": self.engine} if self.engine != "sealed" else {}),
                "max_num_seqs": self.max_num_seqs,
                "max_model_len": self.max_model_len,
                # Listed only when set (measurements of workers on the defaults stay as they were).
                **({"max_num_batched_tokens": self.max_num_batched_tokens} if self.max_num_batched_tokens else {}),
                "dtype": self.dtype,
                "device": self.device,
                # Which kernels compute the logits: one path per device, dtype and CPU class.
                **({"kernel": self.kernel_path} if self.engine == "sealed" else {}),
                # The thread count decides how a step's sums are split (listed only when set).
                **({"threads": self.num_threads} if self.num_threads is not None else {}),
                **({"gpu_memory_utilization": self.gpu_memory_utilization} if self.on_gpu else {}),
                **({"cpu_memory_utilization": self.cpu_memory_utilization}
                   if self.cpu_memory_utilization is not None and not self.on_gpu else {}),
                **({"vllm_cpu_bind": self.vllm_cpu_bind} if self.engine == "vllm" and not self.on_gpu else {}),
            },
        }
