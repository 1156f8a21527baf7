"""One error tree for model packages: every check in protocol.package and enclave_worker.package raises one of these."""


class PackageError(Exception):
    """Base of every package failure. Nothing from a failed package is ever served."""


class PackageFormatError(PackageError):
    """The manifest or layout is malformed or of an unsupported version."""


class PackageIntegrityError(PackageError):
    """Ciphertext was modified, reordered, truncated, extended or spliced, or the digest differs."""


class WrongKeyError(PackageError):
    """The data key is not the one this package was encrypted with."""


class PackageSignatureError(PackageError):
    """The manifest's signature does not verify, or the signer is not the one required."""


class KeySealError(PackageError):
    """A sealed data key (HPKE to a broker import key) cannot be opened or names another package."""


class UploadError(PackageError):
    """A package upload was refused: sizes or digests differ, or the package is invalid."""
