"""Fakes of hardware we cannot have here (SEV-SNP, TDX, NVIDIA GPU CC), at the narrowest seam.

Tests, benchmarks and demos only: nothing here is trusted by default. Each fake answers through
the same interface the kernel or driver offers (configfs-tsm files, the /dev/sev-guest ioctl,
the NVML module), signing with test PKIs in the vendors' real formats, or replaying real captured
bytes and errors where we have them.

The throwaway PKIs: `snp_pki` (AMD ARK/ASK/VCEK, report signing), `tdx_pki` and `tdx_collateral`
(Intel PCK chain, quotes, TCB info, QE identity), `nvgpu_pki` (NVIDIA device chain, RIMs); and the
cases the attestation benchmarks time: `snp_bench`, `tdx_bench`. An import-linter contract in
pyproject.toml keeps every role package and the production verifiers from importing this package.
"""
