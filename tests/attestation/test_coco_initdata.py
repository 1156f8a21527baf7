"""CoCo init-data (attestation/coco_initdata.py): the TOML a Kata pod launches with, its digest as
Kata's runtime sets it, and the worker's reading of it (the Sealed document inside, checked against
the agent policy beside it)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json

import pytest

from attestation.coco_initdata import (
    POLICY_KEY,
    WORKLOAD_KEY,
    CocoInitData,
    from_annotation,
    load_launch_init_data,
    render,
)
from attestation.errors import ParseError, WorkloadMismatch
from attestation.initdata import InitData

POLICY = "package agent_policy\n\ndefault ExecProcessRequest := false\n"
IMAGE = "sealed-worker@sha256:" + "ab" * 32


def workload(policy: str = POLICY, **kw: object) -> InitData:
    fields = {"image": IMAGE, "argv": ("--tee", "snp", "--tenant", "acme\u00e9"), "env": {"SEALED_TEE": "snp"},
              "measured_config": {"tenant": "acme"}, "agent_policy_digest": hashlib.sha256(policy.encode()).hexdigest(),
              **kw}
    return InitData(**fields)  # type: ignore[arg-type]


def test_render_reads_back_and_the_worker_finds_its_document() -> None:
    coco = render(workload(), POLICY)
    assert coco.data[POLICY_KEY] == POLICY and coco.data[WORKLOAD_KEY] == workload().encode().decode()
    for raw in (coco.text.encode(), coco.annotation().encode()):  # the TOML, or the annotation's value
        launched = load_launch_init_data(raw)
        assert launched.workload == workload() and launched.coco == coco
    # A bare Sealed document (no Kata) keeps its own digest.
    bare = load_launch_init_data(workload().encode())
    assert bare.coco is None and bare.digest_for("snp") == workload().host_data()


@pytest.mark.parametrize(("algorithm", "snp", "tdx"), [
    ("sha384", lambda d: d[:32], lambda d: d),
    ("sha256", lambda d: d, lambda d: d + bytes(16)),
    ("sha512", lambda d: d[:32], lambda d: d[:48]),
])
def test_the_digest_is_katas_over_the_exact_text(algorithm: str, snp, tdx) -> None:  # type: ignore[no-untyped-def]
    coco = render(workload(), POLICY, algorithm=algorithm)
    full = hashlib.new(algorithm, coco.text.encode()).digest()
    assert coco.digest_for("snp") == snp(full) and coco.digest_for("tdx") == tdx(full)
    # Another rendering of the same data is another document: the digest covers the bytes.
    respaced = CocoInitData.parse(coco.text.replace("[data]", "\n[data]"))
    assert respaced.data == coco.data and respaced.digest_for("snp") != coco.digest_for("snp")


def test_the_rendering_is_deterministic_and_names_every_change() -> None:
    assert render(workload(), POLICY).text == render(workload(), POLICY).text
    assert render(workload(), POLICY).annotation() == render(workload(), POLICY).annotation()
    floor = render(workload(min_policy_version=3), POLICY)
    assert floor.digest_for("tdx") != render(workload(), POLICY).digest_for("tdx")


def _toml_with(policy: str, document: str) -> str:
    return (f'algorithm = "sha384"\nversion = "0.1.0"\n\n[data]\n"{POLICY_KEY}" = \'\'\'\n{policy}\'\'\'\n'
            f'"{WORKLOAD_KEY}" = {json.dumps(document)}\n')


def test_a_swapped_agent_policy_is_refused() -> None:
    """The host keeps the workload document but launches with an allow-all policy: the TOML's
    digest is another one, and the worker refuses the document before the digest even matters."""
    allow_all = "package agent_policy\n\ndefault ExecProcessRequest := true\n"
    text = _toml_with(allow_all, workload().encode().decode())
    with pytest.raises(WorkloadMismatch, match="not the agent policy"):
        load_launch_init_data(text.encode())


@pytest.mark.parametrize(("text", "error", "match"), [
    ('algorithm = "md5"\nversion = "0.1.0"\n[data]\n', ParseError, "algorithm"),
    ('algorithm = "sha384"\nversion = "0.2.0"\n[data]\n', ParseError, "version"),
    ('algorithm = "sha384"\nversion = "0.1.0"\n[data]\n"a" = 1\n', ParseError, "strings"),
    ('algorithm = "sha384"\nversion = "0.1.0"\n[data]\n"policy.rego" = "x"\n', WorkloadMismatch, "no sealed-worker"),
    ("algorithm = ", ParseError, "not TOML"),
])
def test_malformed_init_data_is_refused(text: str, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        load_launch_init_data(text.encode())


def test_a_document_not_in_canonical_form_is_refused() -> None:
    document = json.dumps(workload().to_dict(), indent=1)
    with pytest.raises(ParseError, match="canonical"):
        load_launch_init_data(_toml_with(POLICY, document).encode())


def test_an_annotation_that_inflates_past_the_limit_is_refused() -> None:
    bomb = base64.b64encode(gzip.compress(b"#" * (2 << 20), mtime=0)).decode()
    with pytest.raises(ParseError, match="1 MiB"):
        from_annotation(bomb)
    with pytest.raises(ParseError, match="malformed"):
        from_annotation("H4sI!!!")


def test_a_value_toml_cannot_hold_literally_is_refused() -> None:
    policy = "package agent_policy\n# '''\n"
    with pytest.raises(ParseError, match="'''"):
        render(workload(policy), policy)
    with pytest.raises(WorkloadMismatch, match="digest"):
        render(workload(), "package other\n")
