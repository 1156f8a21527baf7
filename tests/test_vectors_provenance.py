"""The attestation vectors in the repository are exactly the files their provenance names."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
VECTORS = REPO_ROOT / "tests" / "vectors" / "attestation"
BOOKKEEPING = {"PROVENANCE.json", "MANIFEST.md", "computed_facts.json"}


def _provenance() -> dict:
    return json.loads((VECTORS / "PROVENANCE.json").read_text())


def test_every_vector_matches_its_recorded_sha256() -> None:
    entries = _provenance()["files"]
    assert entries, "PROVENANCE.json lists no files"
    for entry in entries:
        data = (VECTORS / entry["file"]).read_bytes()
        assert len(data) == entry["size"], entry["file"]
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["file"]


def test_only_apache_licensed_files_are_shipped() -> None:
    files = _provenance()["files"]
    assert all(entry["license"].startswith("Apache-2.0") for entry in files)
    listed = {entry["file"] for entry in files} | BOOKKEEPING
    on_disk = {str(p.relative_to(VECTORS)) for p in VECTORS.rglob("*") if p.is_file()}
    assert on_disk == listed, f"unlisted or missing vector files: {on_disk ^ listed}"
    assert (REPO_ROOT / "tests" / "vectors" / "LICENSE.Apache-2.0").read_text().startswith("\n")


def test_sigstore_vectors_and_the_pinned_root_match_their_provenance() -> None:
    sigstore = REPO_ROOT / "tests" / "vectors" / "sigstore"
    entries = json.loads((sigstore / "PROVENANCE.json").read_text())["files"]
    for entry in entries:
        data = (REPO_ROOT / entry["file"]).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["size"], entry["sha256"]), entry["file"]
        assert entry["license"] == "Apache-2.0"
    listed = {entry["file"] for entry in entries if entry["file"].startswith("tests/")}
    bookkeeping = ("PROVENANCE.json", "README.md")
    on_disk = {str(p.relative_to(REPO_ROOT)) for p in sigstore.iterdir() if p.name not in bookkeeping}
    assert on_disk == listed
