"""Which endpoints may serve and in what order: pure functions over catalog records.

The policy (what is allowed, and why), ranking (what a workload costs on each),
the route plan (OpenRouter's ``provider`` object and the price ceilings a
reservation assumes) and the Batch API endpoints under the same policy. No I/O,
no clock; ties are broken deterministically.
"""
