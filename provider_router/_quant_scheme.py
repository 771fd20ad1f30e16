"""Reading a quantization string OpenRouter does not list: its bit width and kind.

OpenRouter's quantization enum is closed today (``int4`` ... ``fp32``), but
providers name schemes in many dialects, and a new value must never pass a floor
just because we cannot read it. :func:`read_scheme` reads what it can:

* GGUF names, ``q4_k_m``, ``q8_0``, ``iq3_xxs``: integer, the digit after ``q``;
* weight/activation names, ``w4a16``, ``w8a8``: integer, the weight bits;
* ``int3``, ``uint4``, ``int4_awq``, ``awq-int4``, ``mxint8``: integer;
* ``fp6``, ``mxfp6``, ``nvfp4``, ``float8``, ``f16``, ``bf16``: float;
* ``e4m3``, ``e2m1``: float of 1 + exponent + mantissa bits;
* ``4bit``, ``8-bit``, ``4.65bpw``: that width, kind unknown.

Several widths in one string (``w4a16-fp8``?) count as the lowest; widths of
more than one kind count as the weaker kind. Anything else (``awq``, ``gptq``,
a version number) is not read: it is *unrecognized*, and the policy rejects it
under any floor. :func:`scheme_tier` places a reading on the precision order of
:mod:`provider_router.quantization`, never above what the bits prove.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Final, Literal

__all__ = ["QuantizationScheme", "read_scheme", "scheme_tier"]

Kind = Literal["int", "float", "unknown"]

_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
_PATTERNS: Final[tuple[tuple[re.Pattern[str], Kind], ...]] = (
    (re.compile(r"(?<![a-z0-9])i?q" + _NUMBER + r"(?![0-9.])"), "int"),
    (re.compile(r"(?<![a-z0-9])w" + _NUMBER + r"a[0-9]+"), "int"),
    (re.compile(r"(?<![a-z0-9])(?:mx|nv)?u?int" + _NUMBER), "int"),
    (re.compile(r"(?<![a-z0-9])(?:mx|nv)?(?:fp|float|bf|f)" + _NUMBER), "float"),
    (re.compile(_NUMBER + r"[-_ ]?(?:bits?|bpw)(?![a-z])"), "unknown"),
)
_EXPONENT_MANTISSA: Final = re.compile(r"(?<![a-z0-9])e([0-9])m([0-9])(?![0-9])")
_MAX_BITS: Final = Decimal(64)
_KIND_ORDER: Final = {"float": 0, "unknown": 0, "int": 1}
"""At 4 bits floats rank below integers (docs/policy.md); unknown takes the weaker."""


@dataclass(frozen=True, slots=True)
class QuantizationScheme:
    """What a quantization string says: ``bits`` of ``kind`` (``int``, ``float``, ``unknown``).

    Attributes:
        raw: the string as the endpoint sent it.
        bits: the (lowest) bit width it names; may be fractional (``fp3.5``).
        kind: integer or float grid, or unknown when only a width is given.
    """

    raw: str
    bits: Decimal
    kind: Kind

    def describe(self) -> str:
        """``4-bit integer``, ``6-bit float``, ``8-bit (kind not stated)``."""
        kind = {"int": "integer", "float": "float", "unknown": "(kind not stated)"}[self.kind]
        return f"{self.bits.normalize():f}-bit {kind}"


def read_scheme(raw: str | None) -> QuantizationScheme | None:
    """The bit width and kind a quantization string names, or None if it names none."""
    if raw is None:
        return None
    text = raw.strip().lower()
    found: list[tuple[Decimal, Kind]] = []
    for pattern, kind in _PATTERNS:
        found.extend((Decimal(m.group(1)), kind) for m in pattern.finditer(text))
    for match in _EXPONENT_MANTISSA.finditer(text):
        found.append((1 + Decimal(match.group(1)) + Decimal(match.group(2)), "float"))
    found = [(width, kind) for width, kind in found if 0 < width <= _MAX_BITS]
    if not found:
        return None
    bits = min(width for width, _ in found)
    kinds = {kind for width, kind in found if width == bits}
    weakest: Kind = min(kinds, key=lambda k: (_KIND_ORDER[k], k))
    return QuantizationScheme(raw=raw, bits=bits, kind=weakest)


def scheme_tier(scheme: QuantizationScheme) -> int:
    """The precision tier a reading earns (0 = below every named tier).

    Tiers as :func:`provider_router.quantization.precision_rank`: 1 four-bit
    floats, 2 int4, 3 six-bit, 4 eight-bit, 5 sixteen-bit, 6 thirty-two. A width
    between two tiers gets the lower one (``q5_k_m`` meets an int4 floor, not an
    fp6 one); below four bits is tier 0, under every floor.
    """
    bits = scheme.bits
    if bits < 4:
        return 0
    if bits < 5:
        return 2 if scheme.kind == "int" else 1
    if bits < 6:
        return 2
    if bits < 8:
        return 3
    if bits < 16:
        return 4
    if bits < 32:
        return 5
    return 6
