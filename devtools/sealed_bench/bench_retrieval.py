"""Retrieval benchmark (issue #51): a corpus of real documentation chunked, embedded by our engine
and indexed by the worker's vector store, against the same library (faiss) used directly.

The corpus: the docstrings of an installed PyPI package (default: transformers), read with `ast`
(nothing imported), in file order, cut by the vector store's own chunking in the embedding model's
tokens. Reported: ingestion (chunks/s and tokens/s of the encoder; index build), recall@10 of the
store's search against exact search, and search latency p50/p99: the store (the worker's path:
rights bitmap, filters, chunk lookup) and a bare faiss HNSW with the same parameters over the same
vectors. No assertions: docs/benchmarks.md records the numbers with the machine.

Run: ``sealed bench retrieval --chunks 10000 --json out.json``.
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
from enclave_worker.retrieval.chunking import ChunkingStrategy
from enclave_worker.retrieval.index import IndexSettings
from enclave_worker.retrieval.vector_store import VectorStore, only_files, readable_by_all


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
    """Files of the corpus as the vector store would get them, chunked up to ``target`` chunks."""

    def __init__(self, encoder: Embedder, package: str, strategy: ChunkingStrategy, target: int) -> None:
        from enclave_worker.retrieval.chunking import chunk_text

        self.files: list[tuple[str, str, int]] = []  # (file id, text, chunks)
        count = 0
        for _file, docs in itertools.groupby(docstrings(package), key=lambda item: item[0]):
            text = "\n\n".join(doc for _, doc in docs)
            n = len(chunk_text(text, encoder.token_offsets(text), strategy))
            self.files.append((f"file-{len(self.files):05d}", text, n))
            count += n
            if count >= target:
                break
        self.chunks = count


def _percentiles(samples: list[float]) -> dict[str, float]:
    ms = np.array(samples) * 1e3
    return {"p50_ms": round(float(np.percentile(ms, 50)), 3), "p99_ms": round(float(np.percentile(ms, 99)), 3),
            "n": len(samples)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    cpu_class = detect_cpu_class()
    path = choose_kernel_path("cpu", "float32", "cpp", cpu_class)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(default_encoder_zip()) as archive:
            archive.extractall(tmp)  # a public model: the tenant's machine, before `sealed encrypt`
        encoder = Embedder(load_encoder_dir(Path(tmp)),
                           BuildOptions(LinearOptions(kernel=path.linear, in_place=True), 512))
    strategy = ChunkingStrategy(args.chunk_tokens, args.overlap_tokens)
    corpus = _Corpus(encoder, args.package, strategy, args.chunks)
    settings = IndexSettings()
    store = VectorStore("vs_bench", encoder.dim, settings)
    t0 = time.perf_counter()
    for file_id, text, _ in corpus.files:
        store.add_file(file_id, f"{file_id}.txt", text, {"part": int(file_id[-1]) % 2}, strategy, encoder)
    ingest_s = time.perf_counter() - t0
    tokens = sum(len(encoder.tokenize([c.text])[0]) for c in store.chunks.values())
    keys = np.array(sorted(store.chunks), dtype=np.int64)
    vectors = store.index._rows[[store.index._row_of[int(k)] for k in keys]]

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
    store_lat, bare_lat, restricted_lat, recalls = [], [], [], []
    half = only_files([f for f, _, _ in corpus.files[::2]])
    for q, want in zip(queries, exact, strict=True):
        t = time.perf_counter()
        hits = store.search(q, 10, readable=readable_by_all)
        store_lat.append(time.perf_counter() - t)
        recalls.append(len({h.key for h in store.index.search(q, 10)} & {int(keys[w]) for w in want}) / 10)
        t = time.perf_counter()
        bare.search(q[None], 10)
        bare_lat.append(time.perf_counter() - t)
        t = time.perf_counter()
        store.search(q, 10, readable=half)
        restricted_lat.append(time.perf_counter() - t)
        if len(hits) != 10:
            raise SystemExit(f"the store returned {len(hits)} hits for k=10")
    return {
        "benchmark": "retrieval", "machine": {"cpu": platform.processor() or platform.machine(),
                                              "cores": os.cpu_count(), "cpu_class": cpu_class,
                                              "threads": args.threads},
        "model": "all-MiniLM-L6-v2 (fp32, kernel path " + path.linear + ")", "index": "faiss " + faiss.__version__
        + f" HNSW M={settings.connectivity} efConstruction={settings.ef_construction} efSearch={settings.ef_search}",
        "corpus": {"package": args.package, "files": len(corpus.files), "chunks": len(store.chunks), "tokens": tokens,
                   "chunking": strategy.as_openai()},
        "ingestion": {"seconds": round(ingest_s, 2), "chunks_per_s": round(len(store.chunks) / ingest_s, 1),
                      "tokens_per_s": round(tokens / ingest_s, 1)},
        "index_build_s": {"bare_faiss": round(bare_build_s, 3)},
        "recall_at_10": round(float(np.mean(recalls)), 4),
        "search": {"store": _percentiles(store_lat), "store_half_the_files_readable": _percentiles(restricted_lat),
                   "bare_faiss": _percentiles(bare_lat)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sealed bench retrieval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=10000, help="stop adding files at this many chunks")
    parser.add_argument("--package", default="transformers", help="installed package whose docstrings are the corpus")
    parser.add_argument("--chunk-tokens", type=int, default=128)
    parser.add_argument("--overlap-tokens", type=int, default=32)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0
