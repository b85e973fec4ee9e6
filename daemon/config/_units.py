"""Byte sizes ("256MiB", "1.5GB") and durations ("60s", "500ms", "1h30m") for config values.

Exact decimal arithmetic is used so "1.5GB" is exactly 1_500_000_000 bytes and "0.1s" is the
float nearest to 0.1, not the sum of binary rounding errors.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

__all__ = [
    "format_bytes",
    "format_duration",
    "human_bytes",
    "human_seconds",
    "parse_bytes",
    "parse_duration",
]

_BYTE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
    # Kubernetes-style binary suffixes are unambiguous, so accept them too.
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
    "pi": 2**50,
}
_AMBIGUOUS_BYTE_UNITS = {"k", "m", "g", "t", "p"}
_BYTE_UNITS_HELP = "B; KB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB powers of 1024"

_DURATION_UNITS: dict[str, Decimal] = {
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
    "d": Decimal(86400),
}
_DURATION_UNITS_HELP = "ms, s, m, h, d (e.g. '500ms', '60s', '5m', '1h30m')"

_NUMBER = r"(?:\d[\d_]*(?:\.\d[\d_]*)?|\.\d[\d_]*)"
_BYTES_RE = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-z]*)\s*$")
_DURATION_PART_RE = re.compile(rf"\s*({_NUMBER})\s*([A-Za-z]+)")


def _decimal(text: str) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation as exc:  # pragma: no cover - the regex only admits valid numbers
        raise ValueError(f"{text!r} is not a number") from exc


def parse_bytes(value: object) -> int:
    """A byte count from an int or a string such as "256MiB", "1.5GB", "4096".

    Raises ValueError with a message that says what is accepted.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a byte size such as '256MiB' or 1048576, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte size cannot be negative, got {value}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0 or not value.is_integer():
            raise ValueError(f"a byte size must be a whole number >= 0, got {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(
            f"expected a byte size such as '256MiB' or 1048576, got {type(value).__name__}"
        )
    match = _BYTES_RE.match(value)
    if match is None:
        raise ValueError(
            f"{value!r} is not a byte size; write a number with an optional unit, "
            f"e.g. '256MiB' ({_BYTE_UNITS_HELP})"
        )
    number, unit = match.group(1), match.group(2).lower()
    if unit in _AMBIGUOUS_BYTE_UNITS:
        upper = unit.upper()
        raise ValueError(
            f"{value!r}: unit {match.group(2)!r} is ambiguous; write '{upper}B' "
            f"(powers of 1000) or '{upper}iB' (powers of 1024)"
        )
    if unit not in _BYTE_UNITS:
        raise ValueError(f"{value!r}: unknown unit {match.group(2)!r} ({_BYTE_UNITS_HELP})")
    total = _decimal(number) * _BYTE_UNITS[unit]
    if total != total.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(total)


def parse_duration(value: object) -> float:
    """Seconds from a number (seconds) or a string such as "60s", "500ms", "5m", "1h30m".

    Raises ValueError with a message that says what is accepted.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as '60s' or 60, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"a duration must be a finite number of seconds >= 0, got {value!r}")
        return seconds
    if not isinstance(value, str):
        raise ValueError(f"expected a duration such as '60s' or 60, got {type(value).__name__}")
    text = value.strip()
    if re.fullmatch(_NUMBER, text):
        return float(_decimal(text))
    total = Decimal(0)
    pos = 0
    while pos < len(text):
        match = _DURATION_PART_RE.match(text, pos)
        if match is None:
            raise ValueError(
                f"{value!r} is not a duration; write a number with a unit "
                f"({_DURATION_UNITS_HELP}) or a plain number of seconds"
            )
        unit = match.group(2).lower()
        if unit not in _DURATION_UNITS:
            raise ValueError(
                f"{value!r}: unknown duration unit {match.group(2)!r}; use {_DURATION_UNITS_HELP}"
            )
        total += _decimal(match.group(1)) * _DURATION_UNITS[unit]
        pos = match.end()
    if not text:
        raise ValueError("empty duration; write e.g. '60s'")
    return float(total)


def format_bytes(value: int) -> str | int:
    """The shortest exact binary-unit spelling ("256MiB"), or the plain int if none is exact."""
    if value > 0:
        for unit, factor in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
            if value % factor == 0:
                return f"{value // factor}{unit}"
        if value % 2**10 == 0:
            return f"{value // 2**10}KiB"
    return value


def format_duration(seconds: float) -> str:
    """A spelling of ``seconds`` that parse_duration reads back to the same float."""
    if seconds > 0 and float(seconds).is_integer():
        whole = int(seconds)
        for unit, factor in (("d", 86400), ("h", 3600), ("m", 60)):
            if whole % factor == 0:
                return f"{whole // factor}{unit}"
        return f"{whole}s"
    millis = seconds * 1000
    if millis > 0 and millis.is_integer() and float(_decimal(f"{int(millis)}") / 1000) == seconds:
        return f"{int(millis)}ms"
    # Decimal(repr(x)) is the shortest exact spelling; ":f" avoids "1e-05" which is no duration.
    return f"{Decimal(repr(seconds)):f}s"


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as the config's sizes) for people reading logs and
    status, not for the config (``format_bytes`` renders those exactly)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_seconds(seconds: float | None) -> str:
    """75 -> '1m15s'; 4000 -> '1h06m'; sub-minute values keep a decimal below 10 s."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"
