"""Fakes for hardware we cannot have, in one place: throwaway AMD, Intel and NVIDIA PKIs that sign
evidence and collateral in the real formats (`snp_pki`, `tdx_pki`, `tdx_collateral`,
`nvgpu_pki`), and the cases the attestation benchmarks time (`snp_bench`, `tdx_bench`).

Tests and benchmarks only. No product module imports this package (an import-linter contract in
pyproject.toml), so none of it is in the worker's measured code, and production verifiers trust
only the pinned vendor roots in `attestation/roots/`.
"""
