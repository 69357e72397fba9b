"""Host-side KV-cache block bookkeeping: a free list of 16-token blocks and block-table assembly.

The GPU never allocates: a sequence's blocks are host decisions written into the block-table buffer as data.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BLOCK_SIZE", "BlockAllocator", "make_block_tables"]

BLOCK_SIZE = 16  # tokens per KV-cache block


class BlockAllocator:
    """Hands out KV block ids from a free list; seeded, the order is shuffled (non-contiguous tables)."""

    def __init__(self, num_blocks: int, seed: int | None = None):
        order = np.arange(num_blocks)
        if seed is not None:
            np.random.default_rng(seed).shuffle(order)
        self._free = [int(i) for i in order[::-1]]  # pop() from the end takes `order` front to back

    @property
    def num_free(self) -> int:
        """Blocks not handed out."""
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """``n`` block ids; raises ``MemoryError`` when fewer are free."""
        if n > len(self._free):
            raise MemoryError(f"KV cache full: {n} blocks wanted, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def grow(self, blocks: list[int], n_tokens: int) -> list[int]:
        """Append blocks to one sequence's list until it holds ``n_tokens`` tokens; returns the list."""
        need = -(-n_tokens // BLOCK_SIZE) - len(blocks)
        if need > 0:
            blocks.extend(self.allocate(need))
        return blocks

    def free(self, blocks: list[int]) -> None:
        """Give blocks back."""
        self._free.extend(reversed(blocks))


def make_block_tables(rows: list[list[int]], max_blocks: int) -> np.ndarray:
    """Per-sequence block lists -> ``int32 [B, max_blocks]``, padded with block 0 (never read: past ctx).

    Raises ``ValueError`` for a row of more than ``max_blocks`` blocks (more tokens than ``max_seq_len``)."""
    table = np.zeros((len(rows), max_blocks), dtype=np.int32)  # [B, MB]
    for b, blocks in enumerate(rows):
        if len(blocks) > max_blocks:
            raise ValueError(f"row {b} holds {len(blocks)} KV blocks ({len(blocks) * BLOCK_SIZE} tokens) but a block "
                             f"table row has {max_blocks} (max_seq_len {max_blocks * BLOCK_SIZE}): shorten the "
                             f"sequence or use a config with a larger max_seq_len")
        table[b, :len(blocks)] = blocks
    return table
