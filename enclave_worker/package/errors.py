"""One error tree for model packages."""


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
