"""A self-signed certificate for the TLS tests (``certificate`` fixture), made by openssl."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from provider_router.testing.loopback import self_signed_certificate


@pytest.fixture(name="certificate", scope="module")
def certificate_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed certificate for localhost and 127.0.0.1 (key beside it)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl CLI to make a test certificate")
    return self_signed_certificate(tmp_path_factory.mktemp("tls"), openssl)
