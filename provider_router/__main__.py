"""``python -m provider_router``: the same as the ``provider-router`` command."""

import sys

try:
    from provider_router.cli import run
except KeyboardInterrupt:  # a Ctrl-C while the command line imports: one line
    print("provider-router: interrupted", file=sys.stderr)
    sys.exit(130)

run()
