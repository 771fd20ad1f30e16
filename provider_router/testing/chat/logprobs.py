"""Token log probabilities (``logprobs: true``, ``top_logprobs: K``) for the synthetic text.

An endpoint that lists ``logprobs`` answers a request that asks for them with
``choices[0].logprobs``, one entry per content token, shaped as the OpenAPI's
``ChatTokenLogprobs``; a stream's chunks carry their own tokens' entries, and other
endpoints answer ``logprobs: null``. The distribution at token ``i`` is fixed by the
simulator's seed and ``i`` alone (honest endpoints serve the same weights): the greedy
token is the filler's word. An endpoint that secretly serves something else
(:mod:`~provider_router.testing.market.degradation`) perturbs every logit with noise
that grows as its agreement falls, and reports the token its content holds. A
simulation of a distribution shift, not of any real provider's (docs/simulator.md).
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Mapping
from functools import lru_cache
from typing import Any, Final

from provider_router.testing.chat.synth import _WORDS, filler
from provider_router.testing.market.degradation import Serves

__all__ = ["CANDIDATES", "DEGRADED_LOGIT_NOISE", "MAX_TOP_LOGPROBS", "check_request", "content"]

MAX_TOP_LOGPROBS: Final = 20
"""The largest ``top_logprobs`` OpenRouter accepts (OpenAPI: "0-20")."""
CANDIDATES: Final = MAX_TOP_LOGPROBS
"""Tokens with their own probability at each position; the rest of the vocabulary
shares what they leave."""
DEGRADED_LOGIT_NOISE: Final = 2.0
"""Logit noise of a degraded endpoint per unit of lost agreement (0.7: σ = 0.6)."""
_MIN_LEAD: Final = 0.05
"""The greedy token's logit lead over the next (greedy decoding emits the argmax)."""
_POOL: Final = tuple(dict.fromkeys(" " + word for word in _WORDS))


def check_request(body: Mapping[str, Any]) -> str | None:
    """Why the request's ``logprobs`` / ``top_logprobs`` are invalid (a 400), else None."""
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        return f"logprobs: expected a boolean, got {wanted!r}"
    top = body.get("top_logprobs")
    if top is None:
        return None
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
        return f"top_logprobs: expected an integer 0..{MAX_TOP_LOGPROBS}, got {top!r}"
    if wanted is not True:
        return "top_logprobs requires logprobs: true"
    return None


def requested(body: Mapping[str, Any], supported: Collection[str]) -> int | None:
    """``top_logprobs`` to answer with (0: the tokens alone), or None: no logprobs
    (not asked for, or the endpoint does not list ``logprobs``)."""
    if body.get("logprobs") is not True or "logprobs" not in supported:
        return None
    top = body.get("top_logprobs")
    return top if isinstance(top, int) else 0


@lru_cache(maxsize=4096)
def _model_logits(seed: int, index: int) -> tuple[tuple[str, float], ...]:
    """The model's candidates at token ``index``, greedy first, with their logits
    (the rest of the vocabulary is the last entry, ``""``)."""
    rng = random.Random(seed * 1_000_033 + index)
    greedy = filler(index, index + 1)
    others = rng.sample([word for word in _POOL if word != greedy], CANDIDATES - 1)
    logit = -rng.uniform(0.2, 3.0)  # how sure the model is of its greedy token
    out = [(greedy, 0.0)]
    for word in others:
        out.append((word, logit))
        logit -= rng.expovariate(2.0)
    out.append(("", logit + math.log(rng.uniform(5.0, 50.0))))  # many small tokens
    return tuple(out)


def _served_logits(
    seed: int, index: int, serves: Serves | None, salt: int
) -> tuple[str, list[tuple[str, float]]]:
    """(the token the endpoint writes, its candidates with logits) at ``index``."""
    logits = list(_model_logits(seed, index))
    if serves is None or serves.agreement >= 1.0:
        return logits[0][0], logits
    token = serves.text(index, index + 1, salt)
    rng = random.Random(salt * 7_368_787 + index)
    sigma = DEGRADED_LOGIT_NOISE * (1.0 - serves.agreement)
    logits = [(word, value + rng.gauss(0.0, sigma)) for word, value in logits]
    if token != logits[0][0]:  # a swapped word: not among the model's candidates
        logits.insert(0, (token, logits[0][1]))
        logits.pop(-2)  # the least likely named candidate joins the rest
    lead = max(value for word, value in logits[1:] if word) + _MIN_LEAD
    logits[0] = (token, max(logits[0][1], lead))
    return token, logits


def _entry(token: str, logprob: float, top: list[dict[str, Any]] | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"token": token, "logprob": logprob, "bytes": list(token.encode())}
    if top is not None:
        entry["top_logprobs"] = top
    return entry


def content(
    start: int, stop: int, top: int, *, seed: int, serves: Serves | None = None, salt: int = 0
) -> list[dict[str, Any]]:
    """``logprobs.content`` for content tokens ``start`` to ``stop``, ``top`` alternatives
    each, as the endpoint (``serves``: what it really serves) writes them."""
    entries = []
    for index in range(start, stop):
        token, logits = _served_logits(seed, index, serves, salt)
        norm = math.log(math.fsum(math.exp(value) for _, value in logits))
        ranked = sorted(((v - norm, w) for w, v in logits if w), reverse=True)
        alternatives = [_entry(word, logprob, None) for logprob, word in ranked[:top]]
        entries.append(_entry(token, logits[0][1] - norm, alternatives))
    return entries
