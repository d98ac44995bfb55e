"""pal_receipt writes a run's receipt; pal_receipt_key makes a signing key; `make run` makes one once."""

import json
import os
import stat
import uuid

import pytest
from django.core.management.base import CommandError

from journal.receipts import public_key_load, signature_problem
from tests.helpers import drive_to_end, echo_step, make_run

from .conftest import public_pem, run_command

pytestmark = pytest.mark.django_db


@pytest.fixture
def finished():
    run = make_run(steps=[echo_step("a", said="héllo")])
    drive_to_end(run)
    return run


def test_pal_receipt_writes_the_signed_receipt_to_a_file(finished, signing_key, tmp_path):
    out = tmp_path / "receipt.json"
    code, output = run_command("pal_receipt", finished.id, "--out", out)
    assert code == 0 and f"to {out}, signed by key" in output
    receipt = json.loads(out.read_text(encoding="utf-8"))
    assert receipt["run_id"] == str(finished.id) and "héllo" not in out.read_text()  # outputs are hashes only
    assert signature_problem(receipt, public_key_load(public_pem(signing_key))) is None
    code, output = run_command("pal_verify", "--file", out)
    assert code == 0, output


def test_pal_receipt_prints_to_standard_output_and_warns_when_unsigned(finished):
    code, output = run_command("pal_receipt", finished.id)
    assert code == 0
    text, warning = output.rsplit("}\n", 1)
    assert json.loads(text + "}")["signature"] is None
    assert "NOT signed" in warning and "pal_receipt_key" in warning


def test_pal_receipt_of_an_unknown_run_is_a_clear_error(tmp_path):
    with pytest.raises(CommandError, match="does not exist"):
        run_command("pal_receipt", uuid.uuid4(), "--out", tmp_path / "r.json")
    with pytest.raises(CommandError, match="does not exist"):
        run_command("pal_receipt", "not-a-run")
    assert not (tmp_path / "r.json").exists()


def test_pal_receipt_key_prints_a_key_the_settings_accept(monkeypatch):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from pal.settings import _receipt_key

    code, pem = run_command("pal_receipt_key")
    assert code == 0 and pem.startswith("-----BEGIN PRIVATE KEY-----")
    monkeypatch.setenv("PAL_RECEIPT_PRIVATE_KEY", pem)
    assert isinstance(_receipt_key(), Ed25519PrivateKey)


def test_pal_receipt_key_writes_a_private_file_and_never_overwrites_one(tmp_path):
    path = tmp_path / "receipt-key.pem"
    code, output = run_command("pal_receipt_key", "--out", path)
    assert code == 0 and "BEGIN PUBLIC KEY" in output and "PRIVATE" not in output.split("Its public key:")[1]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    before = path.read_bytes()
    with pytest.raises(CommandError, match="exists already"):
        run_command("pal_receipt_key", "--out", path)
    assert path.read_bytes() == before


def test_make_run_makes_a_signing_key_once_and_hands_it_to_its_processes(tmp_path, monkeypatch):
    from pal import devrun

    monkeypatch.setattr(devrun, "ROOT", tmp_path)
    # Set (to empty, which counts as unset) rather than deleted, so monkeypatch puts back what was there.
    monkeypatch.setenv("PAL_RECEIPT_PRIVATE_KEY", "")
    monkeypatch.setenv("PAL_RECEIPT_PRIVATE_KEY_FILE", "")
    devrun.ensure_receipt_key()
    path = tmp_path / "var" / "receipt-key.pem"
    assert os.environ["PAL_RECEIPT_PRIVATE_KEY_FILE"] == str(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = path.read_bytes()
    devrun.ensure_receipt_key()
    assert path.read_bytes() == first  # the same key on every `make run`: old receipts still verify


def test_make_run_keeps_a_key_the_operator_set(tmp_path, monkeypatch):
    from pal import devrun

    monkeypatch.setattr(devrun, "ROOT", tmp_path)
    monkeypatch.setenv("PAL_RECEIPT_PRIVATE_KEY_FILE", "/etc/pal/key.pem")
    devrun.ensure_receipt_key()
    assert os.environ["PAL_RECEIPT_PRIVATE_KEY_FILE"] == "/etc/pal/key.pem"
    assert not (tmp_path / "var").exists()
