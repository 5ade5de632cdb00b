"""The one power-of-two rounding the engine's sizes share: cache growth (`kv_cache`), attention
lengths (`graphs`), kernel blocks (`kernels.decode_attention`), top-k widths (`sampler`).

Not here: the bucket lists themselves (`graphs.bucket_sizes`, `graphs.prefill_token_buckets`).
"""

from __future__ import annotations


def pow2_at_least(n: int, minimum: int = 1) -> int:
    """The smallest `minimum` x 2^i >= n (i >= 0): a power of two when `minimum` is one.

    Example: (5, 1) -> 8, (5, 16) -> 16, (17, 16) -> 32, (64, 1) -> 64, (0, 128) -> 128, (50, 24) -> 96."""
    assert minimum >= 1, minimum
    size = minimum
    while size < n:
        size *= 2
    return size
