"""Fixtures for the receipts tests: a signing key in the settings, API clients, and saving a receipt to a file."""

import io
import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command
from django.test import override_settings

from tests.api.conftest import Api, make_user, token_for


@pytest.fixture
def signing_key():
    """Receipts are signed with a fresh Ed25519 key for this test."""
    key = Ed25519PrivateKey.generate()
    with override_settings(PAL_RECEIPT_PRIVATE_KEY=key):
        yield key


@pytest.fixture
def viewer(db):
    return Api(token_for(make_user("vera", "runs.view_run")))


@pytest.fixture
def anonymous(db):
    return Api(None)


def public_pem(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def run_command(name: str, *args) -> tuple[int, str]:
    """Run a management command; return (exit code, everything it wrote). A CommandError propagates."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(name, *[str(a) for a in args], stdout=out, stderr=err)
    except SystemExit as exc:
        return exc.code, out.getvalue() + err.getvalue()
    return 0, out.getvalue() + err.getvalue()


def save(tmp_path, receipt, name="receipt.json"):
    path = tmp_path / name
    path.write_text(json.dumps(receipt, ensure_ascii=False, indent=2), encoding="utf-8")
    return path
