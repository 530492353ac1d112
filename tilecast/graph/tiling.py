"""Tilings: a tile size per named dimension.

Dimensions: batch, seq, embd, head (in whole heads), inner (MLP), vocab. A
dimension that is not named is untiled; a tile size larger than its dimension
also means untiled; the last tile of a dimension may be smaller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

DIMS = ("batch", "seq", "embd", "head", "inner", "vocab")


class TilingError(ValueError):
    """A tiling specification that cannot be used."""


@dataclass(frozen=True)
class Tiling:
    sizes: dict = field(default_factory=dict)

    def __post_init__(self):
        for dim, size in self.sizes.items():
            if dim not in DIMS:
                raise TilingError(f"tile: unknown dimension {dim!r} (known: {', '.join(DIMS)})")
            if not isinstance(size, (int, np.integer)) or isinstance(size, bool):
                raise TilingError(f"tile: {dim} must be a whole number, got {size!r}")
            if size < 1:
                raise TilingError(f"tile: {dim}={size} is below 1")

    @classmethod
    def parse(cls, text: str | None) -> "Tiling":
        """Parse ``"256"``, ``"seq=128,embd=256,head=2"`` or ``"256,head=4"``."""
        if text is None or str(text).strip() == "":
            return cls({})
        blanket: int | None = None
        named: dict[str, int] = {}
        for part in str(text).split(","):
            part = part.strip()
            if not part:
                continue
            if "=" in part:
                name, _, value = part.partition("=")
                name = name.strip()
                if name not in DIMS:
                    raise TilingError(f"tile: unknown dimension {name!r} (known: {', '.join(DIMS)})")
                named[name] = _int(value, name)
            else:
                blanket = _int(part, "every dimension")
        sizes = {d: blanket for d in DIMS} if blanket is not None else {}
        sizes.update(named)
        return cls(sizes)

    @classmethod
    def uniform(cls, size: int) -> "Tiling":
        return cls({d: int(size) for d in DIMS})

    def tile(self, dim: str, extent: int) -> int:
        """The tile size used for a dimension of the given extent."""
        size = self.sizes.get(dim)
        if size is None or size >= extent:
            return extent
        return int(size)

    def describe(self) -> str:
        return ",".join(f"{d}={self.sizes[d]}" for d in DIMS if d in self.sizes) or "untiled"

    def __str__(self) -> str:
        return self.describe()


def _int(value: str, what: str) -> int:
    try:
        size = int(str(value).strip())
    except ValueError:
        raise TilingError(f"tile: {what} needs a whole number, got {value.strip()!r}") from None
    if size < 1:
        raise TilingError(f"tile: {what}={size} is below 1")
    return size


def tile_extents(extent: int, tile: int) -> np.ndarray:
    """Sizes of the tiles of a dimension: full tiles then a smaller last one."""
    n = -(-extent // tile)
    sizes = np.full(n, tile, dtype=np.int64)
    sizes[-1] = extent - tile * (n - 1)
    return sizes
