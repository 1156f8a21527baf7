"""The worker's side of model packages: decrypt straight into tensor memory (`reader`). The tenant's
writer is `enclave_worker.package.writer` (not imported here, so it is not in the worker's
measured code). The format, its errors, signatures and key sealing are contracts in
`protocol.package`."""

from enclave_worker.package.reader import DecryptedModel, decrypt_package

__all__ = ["DecryptedModel", "decrypt_package"]
