"""attestation"""
