"""The init-data document: canonical encoding, the digests the hardware carries, strict decoding."""

from __future__ import annotations

import hashlib
import json

import pytest

from attestation.errors import ParseError, UnsupportedError
from attestation.initdata import InitData, workload_id_of

IMAGE = "registry.example/sealed-worker@sha256:" + "ab" * 32


def doc(**changes: object) -> InitData:
    base: dict = dict(image=IMAGE, argv=("--broker-url", "https://broker", "--tee", "snp"),
                      env={"PYTHONHASHSEED": "0"}, measured_config={"tenant": "acme", "lease_s": 60.0},
                      min_policy_version=3, agent_policy_digest="cd" * 32)
    base.update(changes)
    return InitData(**base)


def test_canonical_bytes_and_digests() -> None:
    init = doc()
    raw = init.encode()
    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")).encode()
    assert init.host_data() == hashlib.sha256(raw).digest() and len(init.host_data()) == 32
    assert init.mr_config_id() == hashlib.sha384(raw).digest() and len(init.mr_config_id()) == 48
    assert init.digest_for("snp") == init.host_data() and init.digest_for("tdx") == init.mr_config_id()
    assert InitData.decode(raw) == init
    with pytest.raises(UnsupportedError):
        init.digest_for("sim")


@pytest.mark.parametrize("change", [
    {"image": "registry.example/sealed-worker@sha256:" + "ac" * 32},
    {"argv": ("--broker-url", "https://other", "--tee", "snp")},
    {"argv": ("--broker-url", "https://broker", "--tee", "snp", "--unsafe-no-tenant-policy")},
    {"env": {"PYTHONHASHSEED": "1"}},
    {"measured_config": {"tenant": "acme", "lease_s": 3600.0}},
    {"min_policy_version": 2},
    {"agent_policy_digest": "ce" * 32},
])
def test_every_field_changes_the_digest(change: dict) -> None:
    assert doc(**change).host_data() != doc().host_data()
    assert doc(**change).mr_config_id() != doc().mr_config_id()


@pytest.mark.parametrize("raw", [
    b"not json",
    b'{"v":1}',
    json.dumps({**doc().to_dict(), "v": 2}, sort_keys=True, separators=(",", ":")).encode(),
    json.dumps({**doc().to_dict(), "extra": 1}, sort_keys=True, separators=(",", ":")).encode(),
    json.dumps(doc().to_dict(), sort_keys=True).encode(),  # not canonical (spaces)
    json.dumps({**doc().to_dict(), "argv": "--tee snp"}, sort_keys=True, separators=(",", ":")).encode(),
])
def test_decode_refuses_anything_but_the_canonical_document(raw: bytes) -> None:
    with pytest.raises(ParseError):
        InitData.decode(raw)


@pytest.mark.parametrize("change", [
    {"image": "registry.example/sealed-worker:latest"},  # a tag, not a digest
    {"min_policy_version": -1},
    {"agent_policy_digest": "not-hex"},
    {"env": {"A": 1}},
])
def test_bad_fields_are_refused(change: dict) -> None:
    with pytest.raises(ParseError):
        doc(**change)


def test_workload_id_is_the_tees_field() -> None:
    assert workload_id_of("snp", {"host_data": "aa", "mr_config_id": "bb"}) == "aa"
    assert workload_id_of("tdx", {"host_data": "aa", "mr_config_id": "bb"}) == "bb"
    assert workload_id_of("sim", {"host_data": "aa"}) == ""
