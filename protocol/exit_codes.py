"""Process exit codes with a meaning across roles: a child's supervisor (`api/supervisor.py`) reads
them, and the roles themselves (the worker may not import `api/`) exit with them."""

from __future__ import annotations

# The process cannot run as configured, and starting it again cannot help (e.g. the worker's
# compiled CPU kernels are missing or stale: enclave_worker/cli.py). It says why in one line on
# stderr before it exits; the supervisor stops the stack and shows that line.
EXIT_CONFIG_ERROR = 3
