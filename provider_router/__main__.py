"""``python -m provider_router``: the same as the ``provider-router`` command."""

from provider_router.cli import run

run()
