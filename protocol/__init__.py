"""Wire contracts shared by more than one role. Imports no role package (api, enclave_worker, key_broker)."""
