"""vLLM as a second engine behind the same worker (docs/vllm-backend.md); vLLM is imported lazily."""
