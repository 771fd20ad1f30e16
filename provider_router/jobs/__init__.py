"""Batch generation: plans, prompt readers, the journal, the runner, progress and exports.

The public names are re-exported flat from :mod:`provider_router`; see
docs/batch.md (running a job) and docs/output.md (what it writes).
"""
