"""Conversations through SealedOpenAI: which calls are sealed, and what the client checks of the
conversation state an answer opened.

Every `/v1/conversations` call but deleting a whole conversation is sealed to the worker as one
document (protocol/openai/conversation_call.py) naming the op, the ids and the call's query and body;
the conversation's id also goes to the gateway in clear (it fetches the blob by it). The answer's
sealed head names the conversation, the version and digest it opened and the ones it left. This
client remembers the newest state it saw of each conversation (for as long as the client lives) and
refuses an answer that opened an older version, or another state of the same version: the gateway
can keep any state a worker sealed, and so could send back one it should have replaced.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from protocol.sealed.http import CONVERSATIONS, ResponseHead
from sealed_client.errors import ConversationMismatch, UnsealedRequest
from sealed_client.stored_state import RESPONSES, json_object

CONVERSATION_PATH = re.compile(r"/v1/conversations(?:/(?P<id>[^/]+)(?:/(?P<items>items)(?:/(?P<item>[^/]+))?)?)?$")
_OPS = {("POST", False, False, False): "create", ("GET", True, False, False): "retrieve",
        ("POST", True, False, False): "update", ("GET", True, True, False): "list_items",
        ("POST", True, True, False): "create_items", ("GET", True, True, True): "retrieve_item",
        ("DELETE", True, True, True): "delete_item"}


def conversation_op(method: str, path: str) -> tuple[str, str | None, str | None] | None:
    """(op, conversation id, item id) of a call to seal; None for the DELETE of a conversation (it names
    an id and answers "deleted": nothing to seal); UnsealedRequest for any other call on conversations."""
    found = CONVERSATION_PATH.search(path)
    assert found is not None
    conv_id, item_id = found.group("id"), found.group("item")
    if method == "DELETE" and conv_id is not None and found.group("items") is None:
        return None
    op = _OPS.get((method, conv_id is not None, found.group("items") is not None, item_id is not None))
    if op is None:
        raise UnsealedRequest(f"{method} {path}: not a Conversations API call this client seals; refused "
                              "before sending")
    return op, conv_id, item_id


def call_body(op: str, conv_id: str | None, item_id: str | None, query: list[tuple[str, str]], body: bytes,
              model: str) -> bytes:
    """The sealed document of one conversation call (values the call does not take are sent as they are:
    the worker refuses them by name)."""
    doc: dict[str, Any] = {"model": model, "op": op, "conversation_id": conv_id, "item_id": item_id, "query": {}}
    if body:
        doc["body"] = json.loads(body)
    for name, value in query:
        if name in ("include[]", "include"):
            doc["query"].setdefault("include", []).append(value)
        else:
            doc["query"][name] = int(value) if name == "limit" and value.isdigit() else value
    return json.dumps(doc).encode()


def model_in(body: bytes) -> str | None:
    """The `model` a conversation create names (this server's extension: the model whose key seals it)."""
    doc = json_object(body) if body else {}
    model = doc.get("model") if doc is not None else None
    return model if isinstance(model, str) and model else None


def named_conversation(endpoint: str, body: bytes) -> str | None:
    """The conversation a sealed request works on (None if it names none, or the body is not an object)."""
    doc = json_object(body) if endpoint in (RESPONSES, CONVERSATIONS) else None
    if doc is None:
        return None
    conv = doc.get("conversation" if endpoint == RESPONSES else "conversation_id")
    if isinstance(conv, dict) and set(conv) == {"id"}:
        conv = conv["id"]
    return conv if isinstance(conv, str) else None


class ConversationMemory:
    """The newest (version, digest) this client saw of each sealed-mode conversation ("" digest: not
    yet known, the version a streamed turn left it at)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()

    def check(self, head: ResponseHead, endpoint: str, asked: str | None) -> None:
        if head.status != 200:
            return  # a refusal opened and changed nothing
        conv = head.conversation
        if asked is None:
            creating = endpoint == CONVERSATIONS
            if not creating:
                if conv is not None:
                    raise ConversationMismatch("the answer worked on a conversation this request did not name")
                return
            if creating and (conv is None or conv.opened_version != 0 or conv.opened_digest or conv.version != 1):
                raise ConversationMismatch("the answer does not state it made a new conversation")
        else:
            if conv is None or conv.id != asked or conv.opened_version < 1:
                raise ConversationMismatch(f"the answer does not state it opened conversation {asked[:64]!r}")
            with self._lock:
                known = self._seen.get(asked)
            if known is not None and (conv.opened_version < known[0] or (
                    conv.opened_version == known[0] and known[1] and conv.opened_digest != known[1])):
                raise ConversationMismatch(f"conversation {asked[:64]!r} was opened at version {conv.opened_version}"
                                           f", older than or other than version {known[0]} this client saw: rolled "
                                           "back or replaced by the gateway; refused")
            if conv.version not in (conv.opened_version, conv.opened_version + 1):
                raise ConversationMismatch("the answer states a conversation version it cannot have left")
        assert conv is not None
        with self._lock:
            known = self._seen.get(conv.id)
            if known is None or conv.version > known[0] or (conv.version == known[0] and not known[1]):
                self._seen[conv.id] = (conv.version, conv.digest)

    def forget(self, conv_id: str) -> None:
        with self._lock:
            self._seen.pop(conv_id, None)
