"""How far one endpoint's next-token distributions are from the reference's, on the same prefixes.

Pure functions over :class:`~provider_router.results.TokenLogprob` lists (an answer's
``logprobs.content``), used by :func:`provider_router.verify` (docs/policy.md,
"Measured fidelity"):

- **the distance at one position** is a lower bound of the total variation distance
  between the two next-token distributions, from what their top-k lists say: the
  larger of (a) the distance between the two coarsened to the tokens *both* list
  plus one bucket for the remainder mass (coarsening never increases a total
  variation distance: the data-processing inequality), and (b) for each side, the
  mass it gives the tokens it favours (shared ones it gives more, ones only it lists)
  less the most the other side can give them (a token missing from a top list has at
  most that list's smallest probability, all of them together at most its
  remainder). It can miss a difference, never invent one; it lies in 0..1 and is
  symmetric, with no infinities where a token is missing (unlike KL). A swapped
  greedy token shows here even with ``top_logprobs`` 0.
- **the same prefixes**: at temperature 0 both answers follow their own greedy
  tokens, so their prefixes are the same up to the first position where the chosen
  tokens differ, and that position itself is still conditioned on an identical
  prefix. Positions ``0..d`` are compared (``d`` the first differing one, or the
  end of the shorter answer, within the first N tokens); later ones condition on
  different text and are not.
- **one value per canary**: the mean distance over its compared positions, so a
  canary counts once however long it agrees (the positions of one answer are not
  independent); the verifier takes a Student-t interval over the canaries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from provider_router.results import TokenLogprob

__all__ = ["aligned_positions", "canary_divergence", "top_k_distance"]


def _listed(entry: TokenLogprob) -> dict[str, float]:
    """The position's listed tokens with their probabilities (the chosen one alone
    without alternatives: ``top_logprobs`` 0)."""
    pairs = entry.top or ((entry.token, entry.logprob),)
    return {token: math.exp(logprob) for token, logprob in pairs}


def _one_sided(mine: dict[str, float], theirs: dict[str, float]) -> float:
    """A lower bound of ``P(E) - Q(E)`` for E = the tokens ``mine`` gives more: the
    shared ones it gives more, and the ones only it lists. ``theirs`` is a top list, so
    a token it does not list has at most its smallest listed probability, and all of
    them together at most its remainder."""
    shared = [t for t in mine if t in theirs and mine[t] > theirs[t]]
    only = [t for t in mine if t not in theirs]
    floor = min(theirs.values())
    rest = max(0.0, 1.0 - math.fsum(theirs.values()))
    bound = math.fsum(mine[t] - theirs[t] for t in shared)
    return bound + math.fsum(mine[t] for t in only) - min(len(only) * floor, rest)


def top_k_distance(a: TokenLogprob, b: TokenLogprob) -> float:
    """A lower bound of the total variation distance of two positions' next-token
    distributions, from their top-k lists (module doc)."""
    mine, theirs = _listed(a), _listed(b)
    shared = mine.keys() & theirs.keys()
    gap = math.fsum(abs(mine[t] - theirs[t]) for t in shared)
    rest_mine = max(0.0, 1.0 - math.fsum(mine[t] for t in shared))
    rest_theirs = max(0.0, 1.0 - math.fsum(theirs[t] for t in shared))
    coarse = 0.5 * (gap + abs(rest_mine - rest_theirs))
    return min(1.0, max(coarse, _one_sided(mine, theirs), _one_sided(theirs, mine)))


def aligned_positions(
    answer: Sequence[TokenLogprob], reference: Sequence[TokenLogprob], tokens: int
) -> int:
    """How many leading positions share their prefix: up to and including the first
    whose chosen tokens differ, within the first ``tokens``."""
    limit = min(len(answer), len(reference), tokens)
    for position in range(limit):
        if answer[position].token != reference[position].token:
            return position + 1
    return limit


def canary_divergence(
    answer: Sequence[TokenLogprob], reference: Sequence[TokenLogprob], tokens: int
) -> float | None:
    """The mean :func:`top_k_distance` over the aligned positions of one canary's two
    answers (None: nothing to compare, an empty answer)."""
    count = aligned_positions(answer, reference, tokens)
    if count == 0:
        return None
    return math.fsum(top_k_distance(answer[i], reference[i]) for i in range(count)) / count
