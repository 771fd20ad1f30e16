"""The open enums of OpenRouter's metadata: quantization and endpoint status.

Open means an unseen wire value is kept, not refused: a quantization string the
spec does not list maps to ``Quantization.UNRECOGNIZED`` (the record keeps the raw
string; the policy reads its bit width where it can, see
:mod:`provider_router.quantization`) and an unseen status code stays a plain int,
classified by the same rule as the known ones. Re-exported by :mod:`provider_router.records`.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

__all__ = ["EndpointHealth", "EndpointStatus", "Quantization"]


class Quantization(StrEnum):
    """Weight precision an endpoint declares: the spec's enum, and ``unrecognized``.

    The wire field may also be ``null`` (``None`` on :class:`Endpoint`); ``unknown``
    is the provider saying it does not declare one. A string the spec does not list
    (``q4_k_m``, ``w4a16``, ``int3``) becomes ``UNRECOGNIZED``, never silently
    ``UNKNOWN``: the raw string is kept in :attr:`Endpoint.quantization_raw`, and
    the policy judges it by the bit width it can read from it, or rejects it.
    """

    INT4 = "int4"
    INT8 = "int8"
    FP4 = "fp4"
    MXFP4 = "mxfp4"
    NVFP4 = "nvfp4"
    FP6 = "fp6"
    FP8 = "fp8"
    MXFP8 = "mxfp8"
    FP16 = "fp16"
    BF16 = "bf16"
    FP32 = "fp32"
    UNKNOWN = "unknown"
    UNRECOGNIZED = "unrecognized"
    """Not a wire value: what a string the spec does not list parses to."""

    @classmethod
    def parse(cls, value: object) -> Quantization | None:
        """Map a wire value to a member; ``None`` stays ``None``, unseen → ``UNRECOGNIZED``."""
        if value is None:
            return None
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            return cls.UNRECOGNIZED


class EndpointHealth(StrEnum):
    """What an endpoint's ``status`` means for routing."""

    OK = "ok"
    DEGRADED = "degraded"
    DOWN = "down"
    UNKNOWN = "unknown"


class EndpointStatus(IntEnum):
    """OpenRouter's endpoint status codes (spec: ``0, -1, -2, -3, -5, -10``).

    The spec gives no meaning. ``0`` is seen on healthy endpoints and ``-2`` on
    endpoints with 87–91 % uptime; OpenRouter's provider guide speaks of normal,
    degraded (deprioritised) and down (fallback only). We read it as "more
    negative is more deranked": 0 is OK, -1..-4 degraded, -5 and below down.
    Unseen codes are kept as plain ints and classified by the same rule
    (:meth:`health_of`).
    """

    OK = 0
    DEPRIORITISED = -1
    DEGRADED = -2
    DEGRADED_SEVERELY = -3
    DOWN = -5
    DISABLED = -10

    @property
    def health(self) -> EndpointHealth:
        return self.health_of(int(self))

    @staticmethod
    def health_of(code: int | None) -> EndpointHealth:
        """The meaning of any status code, including ones the spec does not list."""
        if code is None:
            return EndpointHealth.UNKNOWN
        if code >= 0:
            return EndpointHealth.OK
        if code > -5:
            return EndpointHealth.DEGRADED
        return EndpointHealth.DOWN
