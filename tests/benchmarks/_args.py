"""argparse types the benchmark scripts share: a bad option is one ``error:`` line (exit 2),
never a traceback from deep inside a measurement."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def positive_int(text: str) -> int:
    """A count of samples, runs or items: an int >= 1 (0 would leave no sample to take a
    median of)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def existing_dir(text: str) -> Path:
    """A directory that exists and can be written (the databases are made inside it)."""
    path = Path(text).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not an existing directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text} is not writable")
    return path
