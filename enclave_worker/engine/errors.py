"""The engine's one error tree."""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises."""


class InvalidRequestError(EngineError):
    """The request (prompt, sampling parameters) is invalid; the engine keeps serving others."""


class CheckpointError(EngineError):
    """A checkpoint cannot be loaded (missing files, unsupported architecture, bad tensors)."""


class EngineDeadError(EngineError):
    """The engine has been shut down or its step loop failed."""


class CpuKernelsUnavailable(EngineError):
    """The C++ CPU kernels built at install time are missing, do not load, or were built from another
    source, for another torch or another CPU (kernels/cpu_ops.py); the message is one line."""
