"""Counted events as sentences a person can act on.

At ``--log-level warning`` the command line counts the library's events by
``(event, kind)`` and prints one line per kind at the end (``_logging.py``).
A line names what happened to how many requests, in words, and where there is
something to do, what: "5 requests could not reach OpenRouter (connection
failed): check the network or --base-url". Event names such as
``route.unresolved`` are for machines (``--log-format json``, ``--log-level info``)
and never reach that line. A test holds this table to every warning and error
the package logs.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["describe_kind"]

# Why a request failed, by its error type (the ``error_type`` of ``route.failed``
# and the like): words, and where there is one, what to do.
_WHY: Final = {
    "APIConnectionError": "could not reach OpenRouter (connection failed): check the network "
    "or --base-url",
    "RequestTimeout": "timed out waiting for OpenRouter",
    "RateLimitError": "were rate limited (429) on every attempt",
    "ProviderUnavailableError": "found no provider able to serve them (502/503)",
    "BadRequestError": "were refused as invalid (400): see the prompt's error in the output",
    "NotFoundError": "were not found (404): check --model and --base-url (…/api/v1)",
    "PermissionDeniedError": "were forbidden (403) by OpenRouter",
    "AuthenticationError": "were refused: the API key was rejected (401); check OPENROUTER_API_KEY",
    "PaymentRequiredError": "were refused: payment required (402)",
    "InvalidResponseError": "got an answer that could not be read (not a chat completion, "
    "or a 200 to a streaming request that is not an event stream: see the error)",
    "ResponseCarriedError": "got an answer carrying an error",
    "APIStatusError": "failed with an HTTP error from OpenRouter",
    "PolicyViolationError": "were served by a provider the policy excludes",
    "LedgerWriteError": "were paid for, but the ledger could not record the charge",
    "LedgerUnavailableError": "stopped: the ledger could not be reached",
    "AllAttemptsFailed": "failed after every retry",
    "BudgetExhausted": "not sent: budget exhausted",
    "CreditsExhausted": "not sent: a spend limit OpenRouter keeps ran out (the credits, the "
    "key's limit or a budget)",
    "CancelledError": "abandoned",
}

# ``(event, kind)`` or ``(event, None)`` → a sentence with ``{n}`` (the count),
# ``{s}`` (a plural "s") and ``{why}`` (the words for the kind).
_SENTENCES: Final = {
    ("route.failed", "BudgetExhausted"): "{n} prompt{s} not sent: budget exhausted",
    ("route.failed", "CreditsExhausted"): "{n} prompt{s} not sent: a spend limit OpenRouter "
    "keeps ran out (the summary says which, and what lifts it)",
    ("route.failed", "CancelledError"): "{n} request{s} abandoned",
    ("route.failed", None): "{n} request{s} {why}",
    ("pilot.failed", None): "{n} pilot request{s} {why}",
    ("route.unresolved", None): "{n} request{s} sent but cut off before their cost was known "
    "({why}): their worst case stays held until OpenRouter's records say what they cost",
    ("route.unresolved_counted", None): "{n} request{s} whose cost never became known were "
    "counted at their worst case",
    ("route.cost_unknown", None): "{n} answer{s} without a known cost, counted at worst case",
    ("route.cost_anomaly", None): "{n} answer{s} claimed an implausible cost: checked against "
    "OpenRouter's records before booking",
    ("route.overrun", None): "{n} answer{s} cost more than their reservation",
    ("route.policy_violation", None): "{n} answer{s} served by a provider the policy excludes",
    ("route.credits_exhausted", None): "OpenRouter's credits ran out (402) {n} time{s}: top up, "
    "then run the same command again",
    # The same stop for each other limit, by its kind (``_spend_limits.SpendLimitKind``).
    ("route.credits_exhausted", "key_limit"): "the API key's limit was used up (OpenRouter "
    "refused) {n} time{s}: raise it on OpenRouter's keys page or use another key, then run "
    "the same command again",
    ("route.credits_exhausted", "workspace_budget"): "the workspace's budget was used up "
    "(OpenRouter refused) {n} time{s}: ask the workspace admin to raise it, then run the same "
    "command again",
    ("route.credits_exhausted", "guardrail_budget"): "a guardrail's budget was used up "
    "(OpenRouter refused) {n} time{s}: ask its admin to raise it, then run the same command "
    "again",
    ("route.credits_exhausted", "request_too_large"): "a request was above the account's "
    "in-flight budget (OpenRouter refused) {n} time{s}: lower max_tokens or add credits, then "
    "run the same command again",
    ("route.credits_exhausted", "other"): "a spend limit OpenRouter keeps was used up {n} "
    "time{s}: check the key's limits and the account's budgets, then run the same command "
    "again",
    ("route.generation_lookup_failed", None): "{n} cost lookup{s} in OpenRouter's records "
    "failed (retried later; the money stays held meanwhile)",
    ("route.reconcile_failed", None): "{n} cost lookup{s} failed for good: those requests stay "
    "held at their worst case",
    ("route.key_lookup_failed", None): "the API key's usage could not be read {n} time{s}",
    ("route.unknown_provider", None): "{n} answer{s} did not name the provider that served them",
    ("route.plan_refresh_failed", None): "the list of endpoints could not be refreshed {n} "
    "time{s}: requests kept the previous one",
    ("route.ledger_retry", None): "a ledger write was retried {n} time{s}",
    ("route.attach_failed", None): "{n} generation id{s} could not be written to the ledger: "
    "after a crash those requests count at their worst case",
    ("route.settle_failed", None): "{n} charge{s} could not be written to the ledger",
    ("route.on_paid_failed", None): "{n} paid answer{s} could not be handed to the caller's "
    "on_paid before the settle (the answer itself is returned)",
    ("ledger.recover", None): "open reservations of an earlier run were recovered {n} time{s}",
    ("ledger.recovered", None): "ledger recovery finished {n} time{s} (see summary.json, "
    "recovered)",
    ("ledger.resolve_failed", None): "{n} open reservation{s} could not be priced from "
    "OpenRouter's records: counted at their worst case",
    ("ledger.store_unreachable", None): "the ledger's store could not be reached, or was "
    "locked by another process, {n} time{s} (waited out and retried: nothing lost)",
    ("ledger.store_back", None): "the ledger's store answered again {n} time{s}",
    ("ray.recover_failed", None): "recovering dead Ray actors' reservations failed {n} "
    "time{s} (retried; the final recovery in finish() settles them)",
    ("ray.ledger_write_failed", None): "{n} paid answer{s} of the Ray stage could not be "
    "recorded in the ledger: kept, their reservations held for recovery",
    ("ray.store_failed", None): "{n} paid answer{s} could not be stored in Redis (an "
    "outage): kept in the output rows and stored again when Redis answers",
    ("ray.note_failed", None): "{n} prompt{s} not sent or failed could not be noted in Redis "
    "(the next run sends them again)",
    ("ray.release_failed", None): "{n} Ray actor{s} could not let a prompt's sending "
    "lease go (it runs out after one lease; the same prompt elsewhere waits until then)",
    ("ray.renew_failed", None): "renewing the sending leases of a Ray actor's prompts "
    "failed {n} time{s} (retried every third of a lease, before it runs out)",
    ("ray.spill_failed", None): "a Ray actor's spill file of paid answers Redis could not "
    "take could not be written, emptied or stored {n} time{s} (the answers stay in memory "
    "or on disk and are stored when it can)",
    ("ray.spill_unreadable", None): "{n} line{s} of a dead Ray actor's spill file could not "
    "be read (cut by the kill: that answer was not kept there)",
    ("ray.unexpected_error", None): "{n} prompt{s} of the Ray stage failed with an "
    "unexpected error (a bug: please report it)",
    ("ray.output_repaired", None): "a half-written last answer of an output file was cut "
    "{n} time{s} (its answer is kept in Redis and written again, unpaid)",
    ("ray.control_unreachable", None): "the job's control in Redis could not be read {n} "
    "time{s}: prompts of datasets with a target were held back, unsent (run again to send "
    "them)",
    ("ray.progress_failed", None): "the live progress display failed {n} time{s} (the run went on)",
    ("ledger.late_close", None): "{n} settle{s} found the reservation already closed by a "
    "recovery: its worst case was corrected to the true cost",
    ("ledger.closed_with_open", None): "the ledger closed with reservations still open {n} "
    "time{s}: the next run recovers them",
    ("ledger.write_failed", None): "{n} ledger write{s} failed",
    ("ledger.background_op_failed", None): "{n} background ledger operation{s} failed",
    ("batch.account_reconciled", None): "charges counted at their worst case were corrected "
    "from the API key's usage {n} time{s}",
    ("batch.context_compressed", None): "{n} answer{s} came from a prompt OpenRouter's "
    "context compression cut in the middle: flagged context_compressed in the output",
    ("batch.report_failed", None): "report.html could not be written ({n} time{s}): run "
    "provider-router report DIR",
    ("batch.unexpected_error", None): "{n} prompt{s} failed with an unexpected error (a bug: "
    "please report it)",
    ("batch.verify_failed", None): "{n} provider{s} failed verification against the model's "
    "reference and served nothing more of the job (see the verification lines below)",
    ("batch.verify_check_failed", None): "a re-verification of the providers could not be made "
    "{n} time{s}: their rows since the last passing check stay unchecked until the next one",
    ("batch.ledger_disk_full", None): "the ledger's disk is full ({n} time{s}): free some "
    "space, then run the same command again",
    ("timeline.write_failed", None): "timeline.ndjson could not be written ({n} time{s}): the "
    "report's charts lack detail",
    ("batch.summary_failed", None): "the batch route's summary.json could not be written "
    "({n} time{s}): status reads its batches from the batch journal",
    ("batch.status_write_failed", None): "what the batch route saw of its batches could not "
    "be saved ({n} time{s}): status and the report show the states saved before",
    ("batch.progress_failed", None): "the batch route's live progress could not be shown "
    "({n} time{s}): the run went on; status shows its batches",
}


def _words(name: str) -> str:
    """``route.plan_refresh_failed`` → ``plan refresh failed``, ``OddKind`` → ``odd kind``."""
    tail = name.split(".", 1)[-1].replace("_", " ")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", tail).lower()


def describe_kind(event: str, kind: str | None, count: int) -> str:
    """``5 requests could not reach OpenRouter (connection failed): check ...``."""
    sentence = _SENTENCES.get((event, kind)) or _SENTENCES.get((event, None))
    why = _WHY.get(kind or "", "failed" if kind is None else f"failed ({_words(kind)})")
    if sentence is None:
        sentence = "{what} {n} time{s}" + ("" if kind is None else " ({kind})")
    return sentence.format(
        n=f"{count:,}",
        s="" if count == 1 else "s",
        why=why,
        what=_words(event).capitalize(),
        kind=_words(kind or ""),
    )
