"""`sealed measure snp|tdx`: reference values computed from the image a worker boots.

The output is what a tenant's release policy (`allowed_measurements`) and the published reference
values hold: the operator builds the image, runs this, and publishes the result.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from api.cli.measure_pod import BROKER_HELP, MANIFEST_HELP, broker_from_manifest, pinned_from_manifest, workload_values
from api.orchestrator.broker_pod import PinnedBroker
from api.orchestrator.pin import PinnedWorker
from attestation.errors import AttestationError


def _int(value: str) -> int:
    return int(value, 0)


def _pinned(tee: str, manifest: Path | None, broker: bool, tenant: str | None, model: str | None,
            version: str | None, package: str | None, policy_admin_key: Path | None,
            image_env: list[str]) -> PinnedWorker | PinnedBroker | None:
    """The worker pod of a version, or with --broker the key broker's pod, of the overlay."""
    if manifest is None:
        if broker:
            raise typer.BadParameter("--broker needs --manifest", param_hint="--broker")
        return None
    if broker:
        if tenant or model or version or package or policy_admin_key:
            raise typer.BadParameter("--broker measures the broker's pod: no model version", param_hint="--broker")
        return broker_from_manifest(tee, manifest, image_env)
    return pinned_from_manifest(tee, manifest, tenant, model, version, package, policy_admin_key, image_env)


def build() -> typer.Typer:
    app = typer.Typer(no_args_is_help=True, help="Compute launch measurements (reference values) offline.")

    @app.command("snp")
    def snp(
        ovmf: Path = typer.Option(None, exists=True, dir_okay=False, help="OVMF firmware image (OVMF.fd)"),
        vcpus: int = typer.Option(None, min=1, help="number of guest vCPUs (with --ovmf)"),
        vcpu_type: str = typer.Option(None, help="QEMU CPU model, e.g. EPYC-v4, EPYC-Milan, EPYC-Genoa"),
        vcpu_sig: str = typer.Option(None, help="CPUID signature instead of --vcpu-type (e.g. 0xA00F11)"),
        kernel: Path = typer.Option(None, exists=True, dir_okay=False, help="kernel for measured direct boot"),
        initrd: Path = typer.Option(None, exists=True, dir_okay=False, help="initrd (with --kernel)"),
        append: str = typer.Option(None, help="kernel command line (with --kernel)"),
        guest_features: str = typer.Option("0x1", help="SEV_FEATURES of the VMSA (0x1 = SNP active)"),
        vmm_type: str = typer.Option("qemu", help="qemu | ec2 | gce"),
        ovmf_hash: str = typer.Option(None, help="precomputed digest of the firmware pages (hex)"),
        as_json: bool = typer.Option(False, "--json", help="print a JSON document"),
        manifest: Path = typer.Option(None, exists=True, dir_okay=False, help=MANIFEST_HELP),
        tenant: str = typer.Option(None, help="with --manifest: the model version's tenant"),
        model: str = typer.Option(None, help="with --manifest: the model"),
        version: str = typer.Option(None, help="with --manifest: the version"),
        package: str = typer.Option(None, help="with --manifest: the uploaded package's content address"),
        policy_admin_key: Path = typer.Option(None, exists=True, dir_okay=False,
                                              help="with --manifest: the tenant's policy-admin public key, if any"),
        image_env: list[str] = typer.Option([], "--image-env", help="NAME=VALUE of the worker image's ENV (repeat; "
                                            "default: the template's sealed.dev/image-env annotation)"),
        broker: bool = typer.Option(False, "--broker", help=BROKER_HELP),
    ) -> None:
        """SEV-SNP launch measurement of a QEMU/OVMF guest (SNP firmware ABI 8.17) and, with --manifest,
        the HOST_DATA of a worker pod of that overlay (the digest of its CoCo init-data)."""
        if ovmf is None and manifest is None:
            raise typer.BadParameter("give --ovmf (launch digest), --manifest (HOST_DATA) or both")
        pinned = _pinned("snp", manifest, broker, tenant, model, version, package, policy_admin_key, image_env)
        if ovmf is None:
            assert pinned is not None
            typer.echo(json.dumps({"tee": "snp", "measurement": None, **workload_values(pinned, "snp")}, indent=1)
                       if as_json else pinned.coco.digest_for("snp").hex())
            return
        if vcpus is None:
            raise typer.BadParameter("--ovmf needs --vcpus", param_hint="--vcpus")
        from attestation.snp.launch_digest import load_direct_boot, snp_launch_digest
        from attestation.snp.ovmf import read_ovmf
        from attestation.snp.vmsa import VCPU_TYPES, VmmType

        if (vcpu_type is None) == (vcpu_sig is None) and vmm_type != "gce":
            raise typer.BadParameter("give exactly one of --vcpu-type and --vcpu-sig", param_hint="--vcpu-type")
        if vcpu_type is not None and vcpu_type not in VCPU_TYPES:
            raise typer.BadParameter(f"unknown vCPU type {vcpu_type!r}; one of {', '.join(VCPU_TYPES)}",
                                     param_hint="--vcpu-type")
        try:
            vmm = VmmType(vmm_type)
        except ValueError:
            raise typer.BadParameter("one of qemu, ec2, gce", param_hint="--vmm-type") from None
        try:
            signature = VCPU_TYPES[vcpu_type] if vcpu_type else _int(vcpu_sig) if vcpu_sig else 0
            features = _int(guest_features)
            seed = bytes.fromhex(ovmf_hash) if ovmf_hash else None
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        try:
            digest = snp_launch_digest(read_ovmf(ovmf), vcpus=vcpus, vcpu_sig=signature,
                                       boot=load_direct_boot(kernel, initrd, append), guest_features=features,
                                       vmm=vmm, ovmf_hash=seed)
        except AttestationError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        pod = workload_values(pinned, "snp") if pinned is not None else {}
        if as_json:
            typer.echo(json.dumps({"tee": "snp", "measurement": digest.hex(), "vcpus": vcpus, "vcpu_sig": signature,
                                   "guest_features": features, "vmm": vmm.value, "ovmf": str(ovmf),
                                   "kernel": str(kernel) if kernel else None, "append": append, **pod}, indent=1))
        else:
            typer.echo(digest.hex())
            if pod:
                typer.echo(f"HOST_DATA {pod['host_data']}")

    @app.command("tdx")
    def tdx(
        ccel: Path = typer.Option(None, exists=True, dir_okay=False,
                                  help="CC event log (/sys/firmware/acpi/tables/data/CCEL)"),
        acpi_table: Path = typer.Option(None, exists=True, dir_okay=False,
                                        help="ACPI CCEL table (/sys/firmware/acpi/tables/CCEL): bounds the log"),
        quote: Path = typer.Option(None, exists=True, dir_okay=False,
                                   help="a TDX quote: check the replayed RTMRs against it (exit 1 on mismatch)"),
        as_json: bool = typer.Option(False, "--json", help="print a JSON document"),
        manifest: Path = typer.Option(None, exists=True, dir_okay=False, help=MANIFEST_HELP),
        tenant: str = typer.Option(None, help="with --manifest: the model version's tenant"),
        model: str = typer.Option(None, help="with --manifest: the model"),
        version: str = typer.Option(None, help="with --manifest: the version"),
        package: str = typer.Option(None, help="with --manifest: the uploaded package's content address"),
        policy_admin_key: Path = typer.Option(None, exists=True, dir_okay=False,
                                              help="with --manifest: the tenant's policy-admin public key, if any"),
        image_env: list[str] = typer.Option([], "--image-env", help="NAME=VALUE of the worker image's ENV (repeat)"),
        broker: bool = typer.Option(False, "--broker", help=BROKER_HELP),
    ) -> None:
        """RTMR0..3 replayed from a TDX CC event log (TCG crypto-agile format, SHA-384) and, with
        --manifest, the MRCONFIGID of a worker pod of that overlay (the digest of its CoCo init-data).
        MRTD (the TD firmware's build-time measurement) is not computed here."""
        from attestation.tdx.abi import parse_quote
        from attestation.tdx.eventlog import ccel_log_length, parse_cc_event_log, replay_rtmrs

        if ccel is None and manifest is None:
            raise typer.BadParameter("give --ccel (RTMRs), --manifest (MRCONFIGID) or both")
        pinned = _pinned("tdx", manifest, broker, tenant, model, version, package, policy_admin_key, image_env)
        pod = workload_values(pinned, "tdx") if pinned is not None else {}
        if ccel is None:
            typer.echo(json.dumps({"tee": "tdx", "mrtd": None, "rtmrs": None, **pod}, indent=1) if as_json
                       else f"MRCONFIGID {pod['mr_config_id']}")
            return

        try:
            log = ccel.read_bytes()
            if acpi_table is not None:
                log = log[:ccel_log_length(acpi_table.read_bytes())]
            events = parse_cc_event_log(log)
            rtmrs = replay_rtmrs(events)
            quoted = parse_quote(quote.read_bytes()).body.rtmrs if quote is not None else None
        except AttestationError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        mismatched = [i for i in range(4) if quoted is not None and quoted[i] != rtmrs[i]]
        if as_json:
            typer.echo(json.dumps({"tee": "tdx", "events": len(events), "rtmrs": [r.hex() for r in rtmrs],
                                   "quote_matches": None if quoted is None else not mismatched, **pod}, indent=1))
        else:
            for i, value in enumerate(rtmrs):
                typer.echo(f"RTMR{i} {value.hex()}")
            if pod:
                typer.echo(f"MRCONFIGID {pod['mr_config_id']}")
        if mismatched:
            typer.echo("error: replayed " + ", ".join(f"RTMR{i}" for i in mismatched)
                       + " differ from the quote: the log does not describe this TD", err=True)
            raise typer.Exit(1)

    from api.cli.measure_workload import init_data

    app.command("init-data", context_settings={"allow_interspersed_args": False})(init_data)
    return app
