"""Is the market what it claims? Checks that run before (and during) real spending.

``verify`` measures each allowed endpoint against the model's reference, ``judge``
compares their answers, ``preflight`` asks the live service what a run relies on.
"""
