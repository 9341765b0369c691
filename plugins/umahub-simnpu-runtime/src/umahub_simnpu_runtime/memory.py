"""The device's DRAM allocator: first fit over a sorted free list, neighbours merged.

Buffers are offsets into the device's DRAM, never host pointers. Blocks are
rounded up to :data:`ALIGNMENT` bytes (a DMA burst), so every buffer starts aligned.
"""

from __future__ import annotations

import bisect

from umahub.plugin.device import DeviceError

__all__ = ["ALIGNMENT", "Allocator"]

#: Every block's start and size are multiples of this many bytes.
ALIGNMENT = 64


class Allocator:
    """First-fit allocation of ``size`` bytes of device memory, by offset.

    Args:
        size: the memory's size in bytes.
        name: the device's name, for messages (``"simnpu:0"``).
    """

    def __init__(self, size: int, name: str = "simnpu"):
        self.size = size
        self.name = name
        self._free: list[tuple[int, int]] = [(0, size)]  # (offset, size), by offset
        self._used: dict[int, int] = {}  # offset -> rounded size

    @property
    def free_bytes(self) -> int:
        """Bytes not allocated (maybe in several pieces)."""
        return sum(size for _, size in self._free)

    @property
    def largest_free(self) -> int:
        """The largest block that one allocation can get."""
        return max((size for _, size in self._free), default=0)

    def size_of(self, offset: int) -> int:
        """The (rounded) size of the buffer at ``offset``.

        Raises:
            DeviceError: ``offset`` is not an allocated buffer.
        """
        try:
            return self._used[offset]
        except (KeyError, TypeError):
            raise DeviceError(f"{self.name}: {offset!r} is not a buffer of this device") from None

    def allocate(self, nbytes: int) -> int:
        """The offset of a new block of at least ``nbytes`` bytes.

        Raises:
            DeviceError: a size that is not a non-negative int, or out of memory
                (the message says how much was asked and how much is free).
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise DeviceError(f"{self.name}: cannot allocate {nbytes!r} bytes")
        want = max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)
        for i, (offset, size) in enumerate(self._free):
            if size >= want:
                if size == want:
                    del self._free[i]
                else:
                    self._free[i] = (offset + want, size - want)
                self._used[offset] = want
                return offset
        raise DeviceError(
            f"{self.name}: out of device memory: {nbytes} bytes requested, {self.free_bytes} "
            f"free of {self.size} (largest free block {self.largest_free})"
        )

    def free(self, offset: int) -> None:
        """Give back the block at ``offset``; its free neighbours merge with it.

        Raises:
            DeviceError: ``offset`` is not an allocated buffer (freed twice, or never given).
        """
        size = self.size_of(offset)
        del self._used[offset]
        i = bisect.bisect(self._free, (offset, size))
        self._free.insert(i, (offset, size))
        # merge with the next block, then with the previous one
        if i + 1 < len(self._free) and offset + size == self._free[i + 1][0]:
            self._free[i] = (offset, size + self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:
            start, before = self._free[i - 1]
            self._free[i - 1] = (start, before + self._free[i][1])
            del self._free[i]
