"""A figure measured several times: its median and its spread (lowest and highest).

Example:
    >>> Spread.of([3.0, 1.0, 2.0, 10.0])
    Spread(median=2.5, low=1.0, high=10.0, n=4)
    >>> Spread.of([2.0, 4.0]).scaled(1e6).median
    3000000.0
    >>> Spread.of([]) is None
    True
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Spread:
    """Median, lowest and highest of ``n`` values (one per interleaved repeat)."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread | None:
        """The spread of the values that were measured (``None`` ones are left out); ``None`` if none."""
        measured = [value for value in values if value is not None]
        if not measured:
            return None
        return cls(statistics.median(measured), min(measured), max(measured), len(measured))

    def scaled(self, factor: float) -> Spread:
        return Spread(self.median * factor, self.low * factor, self.high * factor, self.n)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self, digits: int = 2, unit: str = "") -> str:
        """``median [low, high]`` with ``digits`` decimals.

        Example:
            >>> Spread(1.234, 1.0, 1.5, 3).text(1, " µs")
            '1.2 µs [1.0, 1.5]'
        """
        return f"{self.median:.{digits}f}{unit} [{self.low:.{digits}f}, {self.high:.{digits}f}]"
