"""enclave_worker"""
