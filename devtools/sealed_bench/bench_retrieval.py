"""Retrieval benchmark (issue #51): a corpus of real documentation chunked, embedded by our engine
and indexed by the worker's vector store, in plain Python and (``--stack-url``) through a running
stack's API, against exact search.

The corpus: the docstrings of an installed PyPI package (default: transformers), read with `ast`
(nothing imported), in file order, modules joined into files of at least ``--file-chunks`` chunks,
cut by the vector store's own chunking in the embedding model's tokens. Plain side: the library
(chunk, embed, faiss index, search) in this process, no stack. Stack side: each file uploaded and
attached to one vector store with the openai SDK (the worker seals it, chunks, embeds, indexes and
reseals the store's whole snapshot, which the gateway reads back), searched at
`/v1/vector_stores/{id}/search` (the store named to the worker, which holds it open) as bare HTTP and
through the SDK (the boundary's cost is the HTTP figure: retrieval_stack_side.py). The sides
alternate file by file and query by query (the first one alternating), so the machine's other load
hits both. Reported: ingestion (chunks/s, tokens/s), recall@10 of each side against exact search
over the plain side's vectors (a stack passage is matched by file and text), search p50/p99 (plain:
embed the query and search the store, as the worker does), the ratios stack / plain, and the store
and a bare faiss HNSW with the same parameters over given vectors. No assertions: docs/benchmarks.md
records the numbers with the machine.

Run: ``sealed up --embedding-model minilm``, then ``sealed bench retrieval --chunks 10000
--stack-url http://127.0.0.1:8000 --api-key "$(cat ~/.sealed/demo/api-key)" --json out.json``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import itertools
import json
import os
import platform
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import torch

from enclave_worker.engine.embedder import Embedder
from enclave_worker.engine.encoder_checkpoint import default_encoder_zip, load_encoder_dir
from enclave_worker.engine.kernel_path import choose_kernel_path, detect_cpu_class
from enclave_worker.engine.layers.linear import LinearOptions
from enclave_worker.engine.models.options import BuildOptions
from enclave_worker.engine.threads import available_cpus
from enclave_worker.retrieval.chunking import ChunkingStrategy, chunk_text
from enclave_worker.retrieval.filters import Scalar
from enclave_worker.retrieval.index import IndexSettings
from enclave_worker.retrieval.sealed_store import seal_snapshot
from enclave_worker.retrieval.vector_store import VectorStore, only_files, readable_by_all
from sealed_bench.retrieval_stack_side import StackSide


def docstrings(package: str) -> Iterator[tuple[str, str]]:
    """(file, docstring) of every module, class and function of an installed package, in path order."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {package} is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    for path in sorted(root.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 80:
                    yield str(path.relative_to(root)), doc


class _Corpus:
    """Files of the corpus as the vector store would get them: modules' docstrings joined until a file
    holds at least ``file_chunks`` chunks, files added until the corpus holds ``target`` chunks."""

    def __init__(self, encoder: Embedder, package: str, strategy: ChunkingStrategy, target: int,
                 file_chunks: int) -> None:
        self.files: list[tuple[str, str, int]] = []  # (file id, text, chunks)
        count, pending = 0, []
        for _file, docs in itertools.groupby(docstrings(package), key=lambda item: item[0]):
            pending.append("\n\n".join(doc for _, doc in docs))
            text = "\n\n".join(pending)
            n = len(chunk_text(text, encoder.token_offsets(text), strategy))
            if n < file_chunks and count + n < target:
                continue
            self.files.append((f"file-{len(self.files):05d}", text, n))
            count, pending = count + n, []
            if count >= target:
                break
        self.chunks = count


def _percentiles(samples: list[float]) -> dict[str, float]:
    ms = np.array(samples) * 1e3
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "n": len(samples)}


def _encoder(threads: int) -> tuple[Embedder, str, str]:
    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    cpu_class = detect_cpu_class()
    path = choose_kernel_path("cpu", "float32", "cpp", cpu_class)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(default_encoder_zip()) as archive:
            archive.extractall(tmp)  # a public model: the tenant's machine, before `sealed encrypt`
        encoder = Embedder(load_encoder_dir(Path(tmp)),
                           BuildOptions(LinearOptions(kernel=path.linear, in_place=True), 512))
    return encoder, cpu_class, path.linear


def _recall(hits: list[tuple[str, str]], want: set[int], key_of: dict[tuple[str, str], set[int]]) -> float:
    """Share of the exact top 10 among the hits; a hit is named by (file id, passage text)."""
    found: set[int] = set()
    for hit in hits:
        found |= key_of.get(hit, set()) & want
    return len(found) / len(want)


def run(args: argparse.Namespace) -> dict[str, Any]:
    encoder, cpu_class, linear = _encoder(args.threads)
    strategy = ChunkingStrategy(args.chunk_tokens, args.overlap_tokens)
    corpus = _Corpus(encoder, args.package, strategy, args.chunks, args.file_chunks)
    settings = IndexSettings()
    store = VectorStore("vs_bench", encoder.dim, settings)
    stack = (StackSide.connect(args.stack_url, args.api_key, args.chunk_tokens, args.overlap_tokens)
             if args.stack_url else None)
    try:
        return _measure(args, encoder, corpus, strategy, settings, store, stack) | {
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                        "cpu_class": cpu_class, "threads": args.threads, "load_average": os.getloadavg()},
            "model": f"all-MiniLM-L6-v2 (fp32, kernel path {linear})"}
    finally:
        if stack is not None:
            stack.close()


def _measure(args: argparse.Namespace, encoder: Embedder, corpus: _Corpus, strategy: ChunkingStrategy,
             settings: IndexSettings, store: VectorStore, stack: StackSide | None) -> dict[str, Any]:
    plain_s = stack_s = 0.0
    for i, (file_id, text, _) in enumerate(corpus.files):  # interleaved, the first side alternating,
        attributes: dict[str, Scalar] = {"part": i % 2}    # so the machine's other load hits both
        for side in ("plain", "stack") if i % 2 == 0 else ("stack", "plain"):
            if side == "plain":
                t0 = time.perf_counter()
                store.add_file(file_id, f"{file_id}.txt", text, attributes, strategy, encoder)
                plain_s += time.perf_counter() - t0
            elif stack is not None:
                stack_s += stack.add_file(file_id, text, attributes)
    tokens = sum(len(encoder.tokenize([c.text])[0]) for c in store.chunks.values())
    t0 = time.perf_counter()  # what the worker pays on every ingest at this size: serialize and seal it all
    snapshot = seal_snapshot(os.urandom(32), "store/vs_bench", 1, store.to_bytes())
    seal_s = time.perf_counter() - t0
    keys = np.array(sorted(store.chunks), dtype=np.int64)
    vectors = store.index._rows[[store.index._row_of[int(k)] for k in keys]]
    key_of: dict[tuple[str, str], set[int]] = {}
    for key, chunk in store.chunks.items():
        key_of.setdefault((chunk.file_id, chunk.text), set()).add(key)

    t0 = time.perf_counter()
    bare = faiss.IndexHNSWFlat(encoder.dim, settings.connectivity, faiss.METRIC_INNER_PRODUCT)
    bare.hnsw.efConstruction = settings.ef_construction
    bare.add(vectors)
    bare_build_s = time.perf_counter() - t0
    bare.hnsw.efSearch = settings.ef_search

    rng = np.random.default_rng(0)
    picks = rng.choice(len(keys), size=min(args.queries, len(keys)), replace=False)
    questions = [store.chunks[int(keys[i])].text[:200] for i in picks]  # a passage's opening as the query
    queries = encoder.embed_texts(questions)
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    lat: dict[str, list[float]] = {"plain": [], "stack": [], "stack_sdk": [], "store": [], "restricted": [],
                                   "bare": []}
    recalls: dict[str, list[float]] = {"index": [], "plain": [], "stack": [], "stack_sdk": []}
    half = only_files([f for f, _, _ in corpus.files[::2]])
    order = ("plain", "stack", "stack_sdk")
    for n, (question, q, top) in enumerate(zip(questions, queries, exact, strict=True)):
        want = {int(keys[w]) for w in top}
        for side in order[n % 3:] + order[:n % 3]:  # each side first in turn
            if side == "plain":  # as the worker answers a search: embed the query, then search the store
                t = time.perf_counter()
                hits = store.search(encoder.embed_texts([question])[0], 10, readable=readable_by_all)
                lat["plain"].append(time.perf_counter() - t)
                recalls["plain"].append(_recall([(h.file_id, h.text) for h in hits], want, key_of))
            elif stack is not None:  # bare HTTP (the boundary's cost), and the same through the openai SDK
                seconds, found = stack.search_http(question, 10) if side == "stack" else stack.search(question, 10)
                lat[side].append(seconds)
                recalls[side].append(_recall(found, want, key_of))
        recalls["index"].append(len({h.key for h in store.index.search(q, 10)} & want) / 10)
        t = time.perf_counter()
        if len(store.search(q, 10, readable=readable_by_all)) != 10:
            raise SystemExit("the store returned fewer than 10 hits for k=10")
        lat["store"].append(time.perf_counter() - t)
        t = time.perf_counter()
        bare.search(q[None], 10)
        lat["bare"].append(time.perf_counter() - t)
        t = time.perf_counter()
        store.search(q, 10, readable=half)
        lat["restricted"].append(time.perf_counter() - t)
    chunks = len(store.chunks)
    report: dict[str, Any] = {
        "benchmark": "retrieval", "index": "faiss " + faiss.__version__
        + f" HNSW M={settings.connectivity} efConstruction={settings.ef_construction} efSearch={settings.ef_search}",
        "corpus": {"package": args.package, "files": len(corpus.files), "chunks": chunks, "tokens": tokens,
                   "chunking": strategy.as_openai()},
        "ingestion": {"plain": {"seconds": round(plain_s, 2), "chunks_per_s": round(chunks / plain_s, 1),
                                "tokens_per_s": round(tokens / plain_s, 1)}},
        "index_build_s": {"bare_faiss": round(bare_build_s, 3)},
        "snapshot_at_full_size": {"bytes": len(snapshot), "bytes_per_chunk": round(len(snapshot) / chunks),
                                  "serialize_and_seal_s": round(seal_s, 3)},
        "recall_at_10": {"index": round(float(np.mean(recalls["index"])), 4),
                         "plain": round(float(np.mean(recalls["plain"])), 4)},
        "search": {"plain": _percentiles(lat["plain"]), "store_vector_given": _percentiles(lat["store"]),
                   "store_half_the_files_readable": _percentiles(lat["restricted"]),
                   "bare_faiss": _percentiles(lat["bare"])},
    }
    if stack is not None:
        report |= _stack_report(report, stack, stack_s, chunks, tokens, recalls, lat)
    return report


def _stack_report(report: dict[str, Any], stack: StackSide, stack_s: float, chunks: int, tokens: int,
                  recalls: dict[str, list[float]], lat: dict[str, list[float]]) -> dict[str, Any]:
    """The stack's figures beside the plain side's, and the ratios stack / plain. The boundary's cost
    (issue 51) is `search_p50`/`search_p99`: bare HTTP to the stack against the library in this process;
    `*_openai_sdk` add the SDK's client side (retrieval_stack_side.py says why it is apart)."""
    quarter = max(1, len(stack.attach_s) // 4)
    report["ingestion"]["stack"] = {
        "seconds": round(stack_s, 2), "chunks_per_s": round(chunks / stack_s, 1),
        "tokens_per_s": round(tokens / stack_s, 1), "upload_s": round(sum(stack.upload_s), 2),
        "attach_s": round(sum(stack.attach_s), 2),
        "attach_mean_s_first_quarter_of_files": round(float(np.mean(stack.attach_s[:quarter])), 3),
        "attach_mean_s_last_quarter_of_files": round(float(np.mean(stack.attach_s[-quarter:])), 3),
        "store_usage_bytes": stack.usage_bytes()}
    plain, ratios = report["search"]["plain"], {
        "ingestion_seconds": round(stack_s / report["ingestion"]["plain"]["seconds"], 3)}
    for side, suffix in (("stack", ""), ("stack_sdk", "_openai_sdk")):
        report["recall_at_10"][side] = round(float(np.mean(recalls[side])), 4)
        figures = report["search"][side] = _percentiles(lat[side])
        ratios[f"search_p50{suffix}"] = round(figures["p50_ms"] / plain["p50_ms"], 3)
        ratios[f"search_p99{suffix}"] = round(figures["p99_ms"] / plain["p99_ms"], 3)
    return {"stack_over_plain": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealed bench retrieval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=10000, help="stop adding files at this many chunks")
    parser.add_argument("--package", default="transformers", help="installed package whose docstrings are the corpus")
    parser.add_argument("--chunk-tokens", type=int, default=128)
    parser.add_argument("--overlap-tokens", type=int, default=32)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--file-chunks", type=int, default=50,
                        help="join modules' docstrings into files of at least this many chunks")
    parser.add_argument("--threads", type=int, default=available_cpus(),
                        help="the encoder's and faiss' threads (default: as the worker's encoder runs)")
    parser.add_argument("--stack-url", help="also run the same corpus through this stack's HTTP API "
                        "(`sealed up --embedding-model minilm`), interleaved with the plain side")
    parser.add_argument("--api-key", default=os.environ.get("SEALED_API_KEY", ""),
                        help="the stack's tenant API key (default: $SEALED_API_KEY)")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    if args.stack_url and not args.api_key:
        parser.error("--stack-url needs --api-key (or $SEALED_API_KEY)")
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0
