"""A self-signed certificate for the TLS tests (``certificate`` fixture), made by openssl."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(name="certificate", scope="module")
def certificate_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed certificate for localhost and 127.0.0.1 (key beside it)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl CLI to make a test certificate")
    where = tmp_path_factory.mktemp("tls")
    subprocess.run(  # noqa: S603 - fixed arguments, the openssl found on PATH
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(where / "key.pem"),
            "-out",
            str(where / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )
    return where / "cert.pem"
