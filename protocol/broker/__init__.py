"""The key-release protocol as both ends see it: HTTP schemas, HPKE sealing of the released key,
and the worker's typed client."""
