"""Private retrieval inside the boundary (docs/retrieval.md): chunking, attribute filters, the
vector index and the sealed snapshots of a vector store. Nothing here writes to disk or logs text."""
