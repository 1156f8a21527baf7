"""The Sealed client: verify a deployment, seal every request to the attested worker, open and check
every answer. Imports no server code (no torch, FastAPI or gRPC).

    from sealed_client import SealedOpenAI
    client = SealedOpenAI(base_url="https://gateway/v1", api_key=KEY, policy="client-policy.json")
    client.chat.completions.create(model="smollm2-135m-instruct", messages=[...])
"""

from sealed_client.deployment import PinnedKey, verify_sealed_document
from sealed_client.errors import PinConflict, UnsealedRequest
from sealed_client.openai_client import AsyncSealedOpenAI, SealedOpenAI
from sealed_client.receipts import verify_receipt_with_evidence
from sealed_client.session import SealedSession
from sealed_client.trust import ClientTrust

__all__ = ["AsyncSealedOpenAI", "ClientTrust", "PinConflict", "PinnedKey", "SealedOpenAI", "SealedSession",
           "UnsealedRequest", "verify_receipt_with_evidence", "verify_sealed_document"]
