"""The precision order over quantization values, and models' native precision.

The order (lowest first), with ties inside a tier::

    fp4 = mxfp4 = nvfp4  <  int4  <  fp6  <  int8 = fp8 = mxfp8  <  fp16 = bf16  <  fp32

4-bit floats rank below int4 because a model trained quantization-aware in INT4 is
lossless as int4 and re-rounded as fp4; within a tier the differences are smaller than
our evidence about any provider's recipe (docs/policy.md). ``unknown`` has no rank:
the policy resolves it. A string OpenRouter does not list is read for its bit width
and kind (:func:`read_scheme`: ``q4_k_m`` is a 4-bit integer) and placed on the same
order by :func:`scheme_tier`; one that names no width stays unrecognized.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Final, Literal

from provider_router._exceptions import ConfigurationError
from provider_router.catalog.records import Quantization

__all__ = [
    "DEFAULT_NATIVE_PRECISION",
    "NativePrecisionRegistry",
    "QuantizationScheme",
    "parse_quantization",
    "precision_rank",
    "read_scheme",
    "scheme_tier",
]


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

    Tiers as :func:`provider_router.catalog.quantization.precision_rank`: 1 four-bit
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


_RANK: Final[Mapping[Quantization, int]] = {
    Quantization.FP4: 1,
    Quantization.MXFP4: 1,
    Quantization.NVFP4: 1,
    Quantization.INT4: 2,
    Quantization.FP6: 3,
    Quantization.INT8: 4,
    Quantization.FP8: 4,
    Quantization.MXFP8: 4,
    Quantization.FP16: 5,
    Quantization.BF16: 5,
    Quantization.FP32: 6,
}


def precision_rank(quantization: Quantization | None) -> int | None:
    """The tier of a quantization (higher is more precise); ``None`` for
    unknown/unrecognized/null (an unrecognized string: see :func:`read_scheme`)."""
    if quantization is None:
        return None
    return _RANK.get(quantization)


def parse_quantization(value: Quantization | str, *, what: str = "quantization") -> Quantization:
    """A known, ranked quantization from user input (``"int4"``, ``Quantization.FP8``).

    Unlike wire parsing, user input must name a real precision.

    Raises:
        ConfigurationError: the value is not a ranked quantization.
    """
    try:
        quantization = Quantization(str(value).strip().lower())
    except ValueError:
        quantization = Quantization.UNKNOWN
    if quantization not in _RANK:
        choices = ", ".join(q.value for q in _RANK)
        raise ConfigurationError(f"{what} must be one of {choices}; got {value!r}")
    return quantization


def _normalise_model_id(model_id: str) -> str:
    # Variants (":free", ":exacto", ":nitro") serve the same weights.
    return model_id.strip().lower().split(":", 1)[0]


class NativePrecisionRegistry(Mapping[str, Quantization]):
    """Which precision a model's weights natively have, for models not released in 16-bit.

    Immutable: :meth:`with_model` returns an extended copy, so a policy built on
    a registry never changes under it. Lookups ignore case and variant suffixes
    (``moonshotai/kimi-k2.5:exacto`` is ``moonshotai/kimi-k2.5``).

    Args:
        entries: model id → native precision.
        default: the precision assumed for models not listed, or ``None`` to
            assume nothing (the policy then rejects undeclared endpoints of
            those models). Most open-weight models are published in bf16.

    Example:
        >>> registry = NativePrecisionRegistry.builtin().with_model("deepseek/deepseek-v3", "fp8")
        >>> registry.lookup("deepseek/deepseek-v3:free")
        <Quantization.FP8: 'fp8'>
    """

    __slots__ = ("_entries", "default")

    def __init__(
        self,
        entries: Mapping[str, Quantization | str] | None = None,
        *,
        default: Quantization | str | None = Quantization.BF16,
    ) -> None:
        self._entries: dict[str, Quantization] = {
            _normalise_model_id(model): parse_quantization(q, what=f"native precision of {model}")
            for model, q in (entries or {}).items()
        }
        self.default: Quantization | None = (
            None if default is None else parse_quantization(default, what="default precision")
        )

    def __getitem__(self, model_id: str) -> Quantization:
        return self._entries[_normalise_model_id(model_id)]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        entries = ", ".join(f"{k!r}: {v.value!r}" for k, v in sorted(self._entries.items()))
        default = None if self.default is None else self.default.value
        return f"NativePrecisionRegistry({{{entries}}}, default={default!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NativePrecisionRegistry):
            return NotImplemented
        return self._entries == other._entries and self.default == other.default

    def __hash__(self) -> int:
        return hash((frozenset(self._entries.items()), self.default))

    @classmethod
    def builtin(cls) -> NativePrecisionRegistry:
        """The registry the package ships (Kimi K2.5 and K2-Thinking are INT4)."""
        return DEFAULT_NATIVE_PRECISION

    def lookup(self, model_id: str) -> Quantization | None:
        """The listed native precision of ``model_id``, or ``None`` if it is not listed."""
        return self._entries.get(_normalise_model_id(model_id))

    def resolve(self, model_id: str) -> tuple[Quantization | None, bool]:
        """The precision to assume for ``model_id`` and whether the registry listed it.

        Returns ``(listed, True)`` for a listed model, else ``(default, False)``.
        """
        listed = self.lookup(model_id)
        if listed is not None:
            return listed, True
        return self.default, False

    def with_model(
        self, model_id: str, quantization: Quantization | str
    ) -> NativePrecisionRegistry:
        """A copy that also knows ``model_id`` (replacing an existing entry)."""
        entries: dict[str, Quantization | str] = dict(self._entries)
        entries[model_id] = quantization
        return NativePrecisionRegistry(entries, default=self.default)

    def with_default(self, default: Quantization | str | None) -> NativePrecisionRegistry:
        """A copy with another precision assumed for unlisted models."""
        return NativePrecisionRegistry(dict(self._entries), default=default)


DEFAULT_NATIVE_PRECISION: Final = NativePrecisionRegistry(
    {
        # Moonshot trains K2-Thinking and K2.5 quantization-aware and ships INT4 weights.
        "moonshotai/kimi-k2.5": Quantization.INT4,
        "moonshotai/kimi-k2-thinking": Quantization.INT4,
    }
)
"""The built-in registry; extend it with :meth:`NativePrecisionRegistry.with_model`."""
