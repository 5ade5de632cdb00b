"""CI: the built-in models of two test caches are the same bit for bit (their warm-ups' digests).

`python .ci/same_models.py CACHE_A CACHE_B` compares every model directory both hold (warmup.json's
`weights_sha256`); exits 1 naming each model whose digests differ, or if they share none.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def digests(cache: Path) -> dict[str, str]:
    return {p.parent.name: json.loads(p.read_text()).get("weights_sha256", "")
            for p in cache.glob("*/warmup.json")}


def main(a: str, b: str) -> int:
    first, second = digests(Path(a)), digests(Path(b))
    shared = sorted(first.keys() & second.keys())
    differ = [name for name in shared if first[name] != second[name] or not first[name]]
    for name in differ:
        print(f"{name}: {first[name][:16]} in {a}, {second[name][:16]} in {b}")
    print(f"{len(shared) - len(differ)} of {len(shared)} built-in models the same in {a} and {b}")
    return 1 if differ or not shared else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
