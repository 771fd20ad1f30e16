"""The simulated chat completions: validation, delivery, bodies, streams and tools."""
