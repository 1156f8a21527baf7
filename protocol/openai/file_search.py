"""The Responses API's `file_search` tool, the parts that do not depend on where the search runs:
the tool's parameters (checked: a 400 naming the one refused), the query (the caller's latest input
text), the passages as the context message the chat model reads, and the answer's output: a
`file_search_call` item before the message, and `file_citation` annotations on its text.

Citation rule (docs/retrieval.md "file_search"): one `file_citation` per file whose passages were put
in the prompt, in the order of its best passage, each at the end of the answer's text (`index` =
the text's length). A small model does not mark where it used a passage, so the answer cites what it
was given, never a file it was not given.

In plaintext mode the gateway searches (api/gateway/file_search.py); in sealed mode SealedOpenAI
does, in two sealed exchanges (sealed_client/file_search.py); the chat model's worker refuses it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from protocol.openai.errors import OpenAIError
from protocol.openai.schemas import ChatCompletionRequest, ChatMessage

MAX_VECTOR_STORES = 2  # OpenAI's bound on a file_search tool's vector_store_ids
MAX_RESULTS = 50  # OpenAI's bound on max_num_results (1 to 50)
DEFAULT_RESULTS = 10
RESULTS_INCLUDE = "file_search_call.results"
_FIELDS = {"type", "vector_store_ids", "max_num_results", "filters", "ranking_options"}


@dataclass(frozen=True)
class FileSearchTool:
    vector_store_ids: tuple[str, ...]
    max_num_results: int
    filters: dict[str, Any] | None
    score_threshold: float | None
    param: str  # where the tool is in the request: "tools[i]"


def has_file_search(tools: list[dict[str, Any]] | None) -> bool:
    return any(isinstance(t, dict) and t.get("type") == "file_search" for t in tools or [])


def file_search_tool(tools: list[dict[str, Any]] | None) -> FileSearchTool | None:
    """The request's file_search tool (at most one), checked; OpenAIError 400 naming the field refused."""
    found = [(i, t) for i, t in enumerate(tools or []) if t.get("type") == "file_search"]
    if not found:
        return None
    if len(found) > 1:
        raise OpenAIError(400, "at most one file_search tool", param=f"tools[{found[1][0]}].type")
    i, tool = found[0]
    at = f"tools[{i}]"
    extra = sorted(set(tool) - _FIELDS)
    if extra:
        raise OpenAIError(400, f"unsupported file_search field {extra[0][:64]!r}", param=f"{at}.{extra[0][:64]}")
    ids = tool.get("vector_store_ids")
    if (not isinstance(ids, list) or not 0 < len(ids) <= MAX_VECTOR_STORES
            or not all(isinstance(s, str) and 0 < len(s) <= 64 for s in ids) or len(set(ids)) != len(ids)):
        raise OpenAIError(400, f"vector_store_ids must list 1 to {MAX_VECTOR_STORES} distinct vector store ids",
                          param=f"{at}.vector_store_ids")
    count = tool.get("max_num_results", DEFAULT_RESULTS)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_RESULTS:
        raise OpenAIError(400, f"max_num_results must be an integer from 1 to {MAX_RESULTS}",
                          param=f"{at}.max_num_results")
    filters = tool.get("filters")
    if filters is not None and not isinstance(filters, dict):
        raise OpenAIError(400, "filters must be a comparison or compound filter", param=f"{at}.filters")
    return FileSearchTool(tuple(ids), count, filters, _threshold(tool.get("ranking_options"), at), at)


def _threshold(options: Any, at: str) -> float | None:
    if options is None:
        return None
    if not isinstance(options, dict) or set(options) - {"ranker", "score_threshold"} \
            or options.get("ranker", "auto") not in ("auto", "default-2024-11-15", "none"):
        raise OpenAIError(400, "ranking_options may set ranker (auto) and score_threshold only",
                          param=f"{at}.ranking_options")
    threshold = options.get("score_threshold")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not 0.0 <= threshold <= 1.0):
        raise OpenAIError(400, "score_threshold must be a number from 0 to 1",
                          param=f"{at}.ranking_options.score_threshold")
    return None if threshold is None else float(threshold)


def search_query(messages: list[ChatMessage]) -> str:
    """The query: the text of the caller's latest user message; 400 naming `input` when there is none."""
    for message in reversed(messages):
        if message.role == "user" and message.text().strip():
            return message.text()[:4096]
    raise OpenAIError(400, "file_search needs a user message with text to search for", param="input")


@dataclass
class Grounding:
    """One search's passages and the output they make (an item, citations)."""
    query: str
    results: list[dict[str, Any]]  # OpenAI's vector store search results, best first
    with_results: bool  # include: ["file_search_call.results"]
    id: str = field(default_factory=lambda: f"fs_{secrets.token_hex(12)}")

    def item(self, status: str = "completed") -> dict[str, Any]:
        results = [{"file_id": r["file_id"], "filename": r["filename"], "score": r["score"],
                    "attributes": r.get("attributes") or {}, "text": _text(r)} for r in self.results]
        return {"type": "file_search_call", "id": self.id, "status": status, "queries": [self.query],
                "results": results if self.with_results and status == "completed" else None}

    def citations(self, text: str) -> list[dict[str, Any]]:
        seen: dict[str, str] = {}
        for r in self.results:
            seen.setdefault(r["file_id"], r["filename"])
        return [{"type": "file_citation", "index": len(text), "file_id": f, "filename": n} for f, n in seen.items()]

    def context(self) -> str:
        """The passages as the chat model reads them, each labelled with its file's name."""
        if not self.results:
            return "file_search found no passages for this question in the given files."
        passages = "\n\n".join(f"[{r['filename']}]\n{_text(r)}" for r in self.results)
        return ("Answer using the following passages found by file_search in the user's files; each is "
                f"labelled with its file's name.\n\n{passages}")

    def ground(self, chat: ChatCompletionRequest, after_instructions: bool) -> ChatCompletionRequest:
        """The chat request with the passages as a system message just before the input."""
        at = 1 if after_instructions else 0
        messages = [*chat.messages[:at], ChatMessage(role="system", content=self.context()), *chat.messages[at:]]
        return chat.model_copy(update={"messages": messages})


def _text(result: dict[str, Any]) -> str:
    return "".join(part.get("text", "") for part in result.get("content") or [])
