"""The simulated Batch API: its state, its routes, and what it checks in each line."""
