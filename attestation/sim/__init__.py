"""The simulated TEE: for machines without SEV-SNP/TDX. Everything it vouches for is insecure."""

from attestation.sim.tee import SimReport, SimTee, parse_sim_report, verify_sim_report, worker_measurement

__all__ = ["SimReport", "SimTee", "parse_sim_report", "verify_sim_report", "worker_measurement"]
