"""A fake confidential platform on disk: AMD, Intel and NVIDIA test PKIs and the collateral a
broker needs, written to one directory so several processes (the fake hardware inside a worker,
the broker, the test) share it.

Layout of the directory:
  keys/        private keys of the test PKIs (PEM) and their certificates
  roots/       pinned roots for the broker (`--roots-dir`), under the production file names
  collateral/  an offline collateral bundle for the broker (`--collateral-dir`): amd/, intel/
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from attestation.snp.tcb import (
    POLICY_DEBUG,
    POLICY_MIGRATE_MA,
    POLICY_RESERVED_ONE,
    POLICY_SMT,
    Product,
    TcbVersion,
)
from sealed_fakes import nvgpu_pki as gpu_pki
from sealed_fakes import tdx_collateral as testcollateral
from sealed_fakes import tdx_pki as testpki
from sealed_fakes.snp_pki import AmdTestPki, KeySet, make_pki, sign_report, template_report

# What the fake "hardware" measures at launch; tests put it in the release policy.
SNP_MEASUREMENT = bytes(range(48))
TDX_MR_TD = b"\x7d" * 48
CHIP_ID = bytes(range(64))
VCEK_SERIAL = 7


def _pem_key(key: PrivateKeyTypes) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _load_key(data: bytes):  # type: ignore[no-untyped-def]
    return serialization.load_pem_private_key(data, None)


def _pem(certs: list[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


@dataclass(frozen=True)
class GpuIdentity:
    """One fake GPU: its five-certificate chain (leaf first) and the leaf's signing key."""

    chain: list[x509.Certificate]
    key: ec.EllipticCurvePrivateKey
    uuid: str
    # The key of every certificate of `chain` (leaf first, the root's last): the fake NVIDIA OCSP
    # responder signs each certificate's status with its issuer's key.
    chain_keys: tuple[ec.EllipticCurvePrivateKey, ...] = ()

    def chain_pem(self) -> bytes:
        return _pem(self.chain)


@dataclass(frozen=True)
class RimSigner:
    """The fake NVIDIA RIM service: its signing chain ([signer, CA, root]) and their keys."""

    chain: list[x509.Certificate]
    keys: tuple[ec.EllipticCurvePrivateKey, ...]


@dataclass(frozen=True)
class FakePlatform:
    root: Path
    amd: AmdTestPki
    intel: testpki.TestPki
    gpus: tuple[GpuIdentity, ...]
    rim: RimSigner | None = None

    # ---- creation and loading -------------------------------------------------------------
    @classmethod
    def create(cls, root: Path, *, gpus: int = 2, now: dt.datetime | None = None) -> FakePlatform:
        """Generate every PKI (2048-bit AMD test roots keep this fast) and write the directory."""
        now = now or dt.datetime.now(dt.UTC)
        ark, ask, asvk = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(3))
        amd_keys = KeySet(ark, ask, asvk, ec.generate_private_key(ec.SECP384R1()))
        amd = make_pki(amd_keys, Product.MILAN)
        intel = testpki.make_pki()
        idents = make_gpu_identities(gpus)
        platform = cls(root, amd, intel, tuple(idents), make_rim_signer())
        platform._write(now)
        return platform

    def _write(self, now: dt.datetime) -> None:
        keys = self.root / "keys"
        keys.mkdir(parents=True, exist_ok=True, mode=0o700)
        k = self.amd.keys
        doc = {
            "amd": {name: _pem_key(getattr(k, name)).decode() for name in ("ark", "ask", "asvk", "vek")},
            "amd_certs": _pem([self.amd.ark, self.amd.ask, self.amd.asvk]).decode(),
            "intel": {name: _pem_key(getattr(self.intel, name)).decode()
                      for name in ("root_key", "ca_key", "pck_key", "tcb_key")},
            "intel_certs": _pem([self.intel.root, self.intel.ca, self.intel.pck, self.intel.tcb_signer]).decode(),
            "gpus": [{"chain": g.chain_pem().decode(), "key": _pem_key(g.key).decode(), "uuid": g.uuid,
                      "chain_keys": [_pem_key(k).decode() for k in g.chain_keys]} for g in self.gpus],
            **({"nvidia_rim": {"chain": _pem(self.rim.chain).decode(),
                               "keys": [_pem_key(k).decode() for k in self.rim.keys]}} if self.rim else {}),
        }
        (keys / "platform.json").write_text(json.dumps(doc))
        roots = self.root / "roots"
        self.amd.write_roots(roots)
        (roots / "intel_sgx_root_ca_gotdxguest.pem").write_bytes(_pem([self.intel.root]))
        (roots / "nvidia_device_identity_ca.pem").write_bytes(_pem([self.gpus[0].chain[-1]]))
        if self.rim is not None:
            (roots / "nvidia_rim_root.pem").write_bytes(_pem([self.rim.chain[-1]]))
        self.write_collateral(now)

    def write_collateral(self, now: dt.datetime, *, days: int = 30, revoked_vcek: bool = False,
                         revoked_gpus: Collection[int] | None = None) -> Path:
        """An offline collateral bundle (`bundle/`), valid from a day before `now` for `days` days,
        imported into the broker's store (`collateral/`): the AMD CRL (ASK-issued, listing the
        VCEK when `revoked_vcek`) and Intel's tcbInfo, QE identity, signing chain and CRLs; with
        `revoked_gpus`, NVIDIA's too: RIMs and OCSP answers, "revoked" for those GPUs' leaves
        (devtools/sealed_fakes/gpu_collateral.py)."""
        from attestation.collateral import CollateralConfig, CollateralStore

        issue = now - dt.timedelta(days=1)
        bundle, store_dir = self.root / "bundle", self.root / "collateral"
        for d in (bundle, store_dir):
            if d.exists():
                shutil.rmtree(d)
        bundle.mkdir(parents=True)
        until = issue + dt.timedelta(days=days)
        (bundle / "amd-vcek-milan.crl").write_bytes(self.amd.make_crl(
            [VCEK_SERIAL] if revoked_vcek else [], issuer="ask", last_update=issue, next_update=until))
        (bundle / "amd-vlek-milan.crl").write_bytes(self.amd.make_crl([], issuer="asvk", last_update=issue,
                                                                      next_update=until))
        pki = self.intel
        (bundle / "tcbinfo.json").write_bytes(testcollateral.tcb_info(pki, issue=issue, days=days))
        (bundle / "qeidentity.json").write_bytes(testcollateral.qe_identity(pki, issue=issue, days=days))
        (bundle / "signing-chain.pem").write_bytes(pki.signing_chain_pem())
        (bundle / "pck.crl").write_bytes(testcollateral.crl(pki.ca, pki.ca_key, issue=issue, days=days))
        (bundle / "root.crl").write_bytes(testcollateral.crl(pki.root, pki.root_key, issue=issue, days=days))
        if revoked_gpus is not None:
            from sealed_fakes.gpu_collateral import write_gpu_bundle

            write_gpu_bundle(self.rim, self.gpus, bundle, now, revoked_gpus=revoked_gpus)
        CollateralStore(CollateralConfig(store_dir, offline=True)).import_dir(bundle)
        return store_dir

    @classmethod
    def load(cls, root: Path) -> FakePlatform:
        doc = json.loads((root / "keys" / "platform.json").read_text())
        a = doc["amd"]
        ark, ask, asvk = x509.load_pem_x509_certificates(doc["amd_certs"].encode())
        amd = AmdTestPki(Product.MILAN, KeySet(*(_load_key(a[n].encode()) for n in ("ark", "ask", "asvk", "vek"))),
                         ark, ask, asvk)
        i = doc["intel"]
        iroot, ica, ipck, itcb = x509.load_pem_x509_certificates(doc["intel_certs"].encode())
        intel = testpki.TestPki(_load_key(i["root_key"].encode()), iroot, _load_key(i["ca_key"].encode()), ica,
                                _load_key(i["pck_key"].encode()), ipck, _load_key(i["tcb_key"].encode()), itcb)
        gpus = tuple(GpuIdentity(x509.load_pem_x509_certificates(g["chain"].encode()), _load_key(g["key"].encode()),
                                 g["uuid"], tuple(_load_key(k.encode()) for k in g.get("chain_keys", [])))
                     for g in doc["gpus"])
        rim = doc.get("nvidia_rim")
        signer = None if rim is None else RimSigner(x509.load_pem_x509_certificates(rim["chain"].encode()),
                                                    tuple(_load_key(k.encode()) for k in rim["keys"]))
        return cls(root, amd, intel, gpus, signer)

    # ---- what the fake hardware signs -----------------------------------------------------
    @functools.cached_property
    def vcek(self) -> bytes:
        """The chip's VCEK (DER) at the report's TCB, as the host's certificate table holds it."""
        report = template_report(3, Product.MILAN)
        vek = self.amd.make_vek(report.tcb("reported", Product.MILAN), CHIP_ID, serial=VCEK_SERIAL)
        return vek.public_bytes(serialization.Encoding.DER)

    def snp_report(self, report_data: bytes, vmpl: int = 0, *, host_data: bytes = bytes(32), debug: bool = False,
                   migrate_ma: bool = False, committed_tcb: TcbVersion | None = None) -> bytes:
        """What the AMD-SP returns for MSG_REPORT_REQ: a v3 Milan report signed by the VCEK.
        `host_data`: what the host set at launch (an init-data digest, attestation/initdata.py);
        `committed_tcb`: the firmware's committed TCB (default: the reported one)."""
        policy = POLICY_RESERVED_ONE | POLICY_SMT
        policy |= (POLICY_DEBUG if debug else 0) | (POLICY_MIGRATE_MA if migrate_ma else 0)
        extra: dict[str, object] = {"committed_tcb": committed_tcb.encode()} if committed_tcb else {}
        report = template_report(3, Product.MILAN, measurement=SNP_MEASUREMENT, chip_id=CHIP_ID,
                                 report_data=report_data.ljust(64, b"\0"), vmpl=vmpl, host_data=host_data,
                                 policy=policy, **extra)  # type: ignore[arg-type]
        return sign_report(report, self.amd.keys.vek)

    def tdx_quote(self, report_data: bytes, event_log: bytes = b"", *, mr_config_id: bytes = bytes(48),
                  debug: bool = False) -> bytes:
        """What the quoting enclave returns: a v4 TDX quote over a TD report with this REPORTDATA,
        with the RTMRs that `event_log` (a CC event log, e.g. a real CCEL capture) replays to, and
        the MRCONFIGID the host set at TD creation (an init-data digest)."""
        fields: dict[str, bytes] = {"mr_config_id": mr_config_id}
        if debug:
            fields["td_attributes"] = bytes.fromhex("0100001000000000")  # the default's bits plus DEBUG (bit 0)
        if event_log:
            from attestation.tdx.eventlog import parse_cc_event_log, replay_rtmrs

            fields |= {f"rtmr{i}": r for i, r in enumerate(replay_rtmrs(parse_cc_event_log(event_log)))}
        return testpki.build_quote(self.intel, report_data=report_data.ljust(64, b"\0"), mr_td=TDX_MR_TD,
                                   **fields)  # type: ignore[arg-type]  # TD body fields: bytes keywords


def fwid_of(index: int) -> bytes:
    return bytes([0x11 + index]) * 48


def make_gpu_identities(count: int) -> list[GpuIdentity]:
    """`count` Hopper-layout chains (leaf, BROM, ICA, Identity, root) under ONE test Device
    Identity CA, each leaf with its own key and FWID, as on a multi-GPU board."""
    root_key = ec.generate_private_key(ec.SECP384R1())
    root_name = gpu_pki._name(gpu_pki.LAYERS[-1])
    root = _gpu_cert(root_name, root_name, root_key, root_key, ca=True)
    out = []
    for index in range(count):
        keys = [ec.generate_private_key(ec.SECP384R1()) for _ in gpu_pki.LAYERS[:-1]]
        names = [gpu_pki._name(f"{cn} {index}") for cn in gpu_pki.LAYERS[:-1]]
        chain = [root]
        issuer_name, issuer_key = root_name, root_key
        for layer in range(len(keys) - 1, -1, -1):
            fwid = fwid_of(index) if layer == 0 else None
            cert = _gpu_cert(names[layer], issuer_name, keys[layer], issuer_key, ca=layer > 0, fwid=fwid)
            chain.insert(0, cert)
            issuer_name, issuer_key = names[layer], keys[layer]
        out.append(GpuIdentity(chain, keys[0], f"GPU-{index:08x}-fake-4000-8000-000000000000",
                               (*keys, root_key)))
    return out


def _gpu_cert(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey,
              signer: ec.EllipticCurvePrivateKey, *, ca: bool, fwid: bytes | None = None) -> x509.Certificate:
    from cryptography.hazmat.primitives import hashes

    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(gpu_pki.NOT_BEFORE).not_valid_after(gpu_pki.NOT_AFTER)
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if fwid is not None:
        builder = builder.add_extension(x509.UnrecognizedExtension(
            gpu_pki.FWID_OID, gpu_pki.fwid_extension(key.public_key(), fwid)), critical=False)
    return builder.sign(signer, hashes.SHA384())


def make_rim_signer() -> RimSigner:
    return RimSigner(*gpu_pki.make_rim_chain_keys())


def gpu_report(ident: GpuIdentity, index: int, nonce: bytes, measurements: dict[int, bytes] | None = None) -> bytes:
    """SPDM GET_MEASUREMENTS request || signed MEASUREMENTS response, as the GPU returns it;
    `measurements`: what this GPU's firmware measured (default: what the fake RIMs hold)."""
    spec = gpu_pki.EvidenceSpec(nonce=nonce, fwid=fwid_of(index))
    if measurements is not None:
        spec = dataclasses.replace(spec, measurements=measurements)
    return gpu_pki.make_evidence(spec, ident.key)
