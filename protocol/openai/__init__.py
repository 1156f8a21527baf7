"""The OpenAI API as Sealed serves it: request schemas, request planning, response rendering.

Shared by the gateway (plaintext mode) and the worker (sealed mode, where only the worker may read
a request), so both answer byte-for-byte alike. Imports no role package except the gRPC messages,
which move into protocol/ with the rest of the wire contracts.
"""
