"""Memory budgets: parse what the user wrote, resolve it against a device's capacity.

Accepted forms: an int of bytes, ``"12GB"`` (powers of 10: B, KB, MB, GB, TB),
``"12GiB"`` (powers of 2: KiB, MiB, GiB, TiB), ``"80%"`` of the device, ``"auto"`` (the
device's free memory: the session keeps its one reserve under every budget, ``"auto"`` included,
so ``"auto"`` plans under the free memory less that reserve).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ACCEPTED_FORMS = (
    'an int of bytes (12_000_000_000), "12GB", "12000MB", "12GiB", "80%" of the device, or "auto"'
)

_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")
_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


@dataclass(frozen=True)
class Budget:
    """A parsed budget; :meth:`resolve` turns it into bytes for a given device.

    Example:
        >>> Budget.parse("12GB").resolve(total_bytes=80 * 10**9)
        12000000000
        >>> Budget.parse("50%").resolve(total_bytes=2**30)
        536870912
        >>> Budget.parse("auto").resolve(total_bytes=80 * 10**9, free_bytes=70 * 10**9)  # all that is free
        70000000000
    """

    kind: str  # "bytes", "fraction" or "auto"
    value: float

    @classmethod
    def parse(cls, spec: int | str | Budget) -> Budget:
        """Check the syntax; raises ``ValueError`` naming the accepted forms."""
        if isinstance(spec, Budget):
            return spec
        if isinstance(spec, bool) or not isinstance(spec, (int, str)):
            raise ValueError(f"budget must be {ACCEPTED_FORMS}; got {spec!r} ({type(spec).__name__})")
        if isinstance(spec, int):
            if spec <= 0:
                raise ValueError(
                    f"budget must be a positive number of bytes; got {spec}. Use {ACCEPTED_FORMS}."
                )
            return cls("bytes", float(spec))
        text = spec.strip()
        if text.lower() == "auto":
            return cls("auto", 0.0)
        if match := _PERCENT.match(text):
            percent = float(match.group(1))
            if not 0 < percent <= 100:
                raise ValueError(
                    f"budget percentage must lie in (0, 100]; got {spec!r}. Use {ACCEPTED_FORMS}."
                )
            return cls("fraction", percent / 100)
        if match := _SIZE.match(text):
            number, unit = float(match.group(1)), match.group(2).upper()
            if unit in _UNITS and number > 0:
                return cls("bytes", float(int(number * _UNITS[unit])))
            if unit in _UNITS:
                raise ValueError(f"budget must be positive; got {spec!r}. Use {ACCEPTED_FORMS}.")
        raise ValueError(f"cannot read budget {spec!r}: use {ACCEPTED_FORMS}")

    def resolve(
        self, total_bytes: int, free_bytes: int | None = None, device_name: str = "the device"
    ) -> int:
        """Bytes for a device with ``total_bytes`` of memory (``free_bytes`` for ``"auto"``,
        which resolves to all of them: the reserve is the session's, kept under any budget).

        Raises ``ValueError`` when the budget is larger than the device.
        """
        if self.kind == "auto":
            free = total_bytes if free_bytes is None else free_bytes
            if free <= 0:
                raise ValueError(
                    f'budget "auto": {device_name} has no memory free; free some memory or give an '
                    "explicit budget"
                )
            return free
        if self.kind == "fraction":
            return int(total_bytes * self.value)
        resolved = int(self.value)
        if resolved > total_bytes:
            raise ValueError(
                f"budget {format_bytes(resolved)} is larger than {device_name} "
                f"({format_bytes(total_bytes)}); give at most {format_bytes(total_bytes)} "
                'or a share such as "80%"'
            )
        return resolved

    def __str__(self) -> str:
        if self.kind == "auto":
            return "auto"
        if self.kind == "fraction":
            return f"{self.value * 100:g}%"
        return format_bytes(int(self.value))


def format_bytes(nbytes: float) -> str:
    """Human-readable bytes in powers of 10 (``format_bytes(1.5e9) == '1.50 GB'``)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{int(nbytes)} B"
