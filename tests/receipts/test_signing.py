"""Signed receipts: served signed by the API, verifiable offline with the served public key, and any byte
changed in a saved receipt fails that verification."""

import base64
import json

import pytest
from django.core.management.base import CommandError

from journal.receipts import canonical_bytes, key_id, public_key_load, signature_problem
from runs.receipts import run_receipt
from tests.helpers import drive_to_end, echo_step, make_run

from .conftest import public_pem, run_command, save

LLM = {
    "id": "draft",
    "kind": "llm_call",
    "model": "gpt-4o-mini",
    "provider": "fake",
    "prompt": "Summarise {{ input.t }}",
}


@pytest.fixture
def finished(db):
    run = make_run(steps=[LLM, echo_step("done", said="ok")], input={"t": "the printer — it is on fire ✓"})
    drive_to_end(run)
    return run


def test_a_receipt_from_the_api_verifies_with_the_served_public_key(finished, signing_key, viewer, anonymous):
    response = viewer.get(f"/runs/{finished.id}/receipt")
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    receipt = response.json()
    served = anonymous.get("/receipts/public-key")
    public = public_key_load(served.content)
    assert served["X-PAL-Key-Id"] == key_id(public) == receipt["signed"]["key_id"]
    assert receipt["signed"]["alg"] == "Ed25519" and "sort_keys" in receipt["signed"]["canonical"]
    assert signature_problem(receipt, public) is None
    # The signature is exactly Ed25519 over the documented canonical form: checkable without our code.
    body = {k: v for k, v in receipt.items() if k != "signature"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert canonical == canonical_bytes(receipt)
    public.verify(base64.b64decode(receipt["signature"]), canonical)


def test_the_same_run_gives_the_same_signed_receipt(finished, signing_key):
    assert run_receipt(run_id=finished.id) == run_receipt(run_id=finished.id)


def test_a_saved_receipt_verifies_offline(finished, signing_key, tmp_path):
    path = save(tmp_path, run_receipt(run_id=finished.id))
    (tmp_path / "key.pem").write_bytes(public_pem(signing_key))
    code, output = run_command("pal_verify", "--file", path, "--public-key", tmp_path / "key.pem")
    assert code == 0 and output.startswith(f"OK {path}: receipt of run {finished.id}") and output.count("\n") == 1


def _other_digit(text: str) -> str:
    return ("1" if text[0] == "0" else "0") + text[1:]


@pytest.mark.parametrize(
    "change",
    [
        ("status", lambda r: r.update(status="failed")),
        ("a token count", lambda r: r["steps"][0].update(prompt_tokens=r["steps"][0]["prompt_tokens"] + 1)),
        ("a cost", lambda r: r["totals"].update(cost_usd="0")),
        # Its first hex digit turned into another one (a fixed "0" changed nothing in one run of sixteen).
        ("the head hash", lambda r: r["journal"].update(head_hash=_other_digit(r["journal"]["head_hash"]))),
        ("the signed block", lambda r: r["signed"].update(canonical=r["signed"]["canonical"] + " ")),
    ],
    ids=lambda c: c[0] if isinstance(c, tuple) else "",
)
def test_a_changed_field_in_a_saved_receipt_fails_offline_verification(finished, signing_key, tmp_path, change):
    receipt = run_receipt(run_id=finished.id)
    change[1](receipt)
    path = save(tmp_path, receipt)
    (tmp_path / "key.pem").write_bytes(public_pem(signing_key))
    code, output = run_command("pal_verify", "--file", path, "--public-key", tmp_path / "key.pem")
    assert code == 1 and "changed after it was signed" in output


def test_every_single_letter_or_digit_changed_in_a_saved_receipt_is_caught(finished, signing_key):
    receipt = run_receipt(run_id=finished.id)
    public = signing_key.public_key()
    text = json.dumps(receipt, ensure_ascii=False)
    caught = 0
    for index, char in enumerate(text):
        if not char.isalnum():
            continue  # keep the JSON parseable: change letters and digits only
        changed = text[:index] + ("x" if char != "x" else "y") + text[index + 1 :]
        try:
            tampered = json.loads(changed)
        except ValueError:
            continue
        if tampered == receipt:
            continue
        assert signature_problem(tampered, public) is not None, (
            f"a change at {index} ({text[index - 20 : index + 20]!r}) went unseen"
        )
        caught += 1
    assert caught > 500


def test_a_receipt_signed_by_another_key_names_both_keys(finished, signing_key, tmp_path):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = save(tmp_path, run_receipt(run_id=finished.id))
    other = Ed25519PrivateKey.generate()
    (tmp_path / "other.pem").write_bytes(public_pem(other))
    code, output = run_command("pal_verify", "--file", path, "--public-key", tmp_path / "other.pem")
    assert code == 1 and key_id(signing_key.public_key()) in output and key_id(other.public_key()) in output


def test_an_unsigned_receipt_does_not_verify(finished, tmp_path, signing_key):
    from django.test import override_settings

    with override_settings(PAL_RECEIPT_PRIVATE_KEY=None):
        receipt = run_receipt(run_id=finished.id)
    assert receipt["signed"] is None and receipt["signature"] is None
    path = save(tmp_path, receipt)
    (tmp_path / "key.pem").write_bytes(public_pem(signing_key))
    code, output = run_command("pal_verify", "--file", path, "--public-key", tmp_path / "key.pem")
    assert code == 1 and "not signed" in output


def test_without_public_key_the_configured_key_is_used(finished, signing_key, tmp_path):
    path = save(tmp_path, run_receipt(run_id=finished.id))
    assert run_command("pal_verify", "--file", path)[0] == 0


# --- clear errors ---------------------------------------------------------------------------------


def test_a_missing_receipt_file_is_a_clear_error(tmp_path, db, signing_key):
    with pytest.raises(CommandError, match=r"receipt file .*missing\.json does not exist"):
        run_command("pal_verify", "--file", tmp_path / "missing.json")


def test_a_receipt_file_that_is_not_json_is_a_clear_error(tmp_path, db, signing_key):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CommandError, match="is not JSON"):
        run_command("pal_verify", "--file", tmp_path / "bad.json")


def test_a_missing_or_bad_public_key_is_a_clear_error(finished, signing_key, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    path = save(tmp_path, run_receipt(run_id=finished.id))
    with pytest.raises(CommandError, match=r"public key file .*nokey\.pem does not exist"):
        run_command("pal_verify", "--file", path, "--public-key", tmp_path / "nokey.pem")
    (tmp_path / "garbage.pem").write_text("hello")
    with pytest.raises(CommandError, match="is not a PEM public key"):
        run_command("pal_verify", "--file", path, "--public-key", tmp_path / "garbage.pem")
    rsa_public = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
    (tmp_path / "rsa.pem").write_bytes(
        rsa_public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(CommandError, match="is not an Ed25519 key"):
        run_command("pal_verify", "--file", path, "--public-key", tmp_path / "rsa.pem")
    private = signing_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "private.pem").write_bytes(private)
    with pytest.raises(CommandError, match="is a private key"):
        run_command("pal_verify", "--file", path, "--public-key", tmp_path / "private.pem")


def test_no_public_key_and_none_configured_is_a_clear_error(finished, tmp_path, signing_key):
    from django.test import override_settings

    path = save(tmp_path, run_receipt(run_id=finished.id))
    with override_settings(PAL_RECEIPT_PRIVATE_KEY=None), pytest.raises(CommandError, match="give --public-key"):
        run_command("pal_verify", "--file", path)


# --- a saved receipt against the database ----------------------------------------------------------


def test_a_journal_rewritten_with_fresh_hashes_passes_the_chain_but_not_a_signed_receipt(
    finished, signing_key, tmp_path
):
    """Whoever can write the database can recompute every hash and the recorded head: the chain then holds.
    A receipt signed before, kept elsewhere, still tells."""
    from journal.models import JournalEvent
    from journal.services import GENESIS, row_hash
    from tests.journal.test_chain import db_id, jsonb, sql, verify

    path = save(tmp_path, run_receipt(run_id=finished.id))
    (tmp_path / "key.pem").write_bytes(public_pem(signing_key))
    sql(
        f"UPDATE journal_events SET payload = %s{jsonb()} WHERE run_id = %s AND seq = 4",
        json.dumps({"output": {"text": "something else"}}),
        db_id(finished.id),
    )
    prev = GENESIS
    for row in JournalEvent.objects.filter(run_id=finished.id).order_by("seq"):
        digest = row_hash(
            prev_hash=prev,
            run_id=row.run_id,
            seq=row.seq,
            kind=row.kind,
            step_id=row.step_id,
            attempt=row.attempt,
            payload=row.payload,
            created_at=row.created_at,
            writer=row.writer,
            epoch=row.epoch,
        )
        sql(
            "UPDATE journal_events SET prev_hash = %s, hash = %s WHERE run_id = %s AND seq = %s",
            prev,
            digest,
            db_id(finished.id),
            row.seq,
        )
        prev = digest
    sql("UPDATE runs SET journal_head_hash = %s WHERE id = %s", prev, db_id(finished.id))
    assert verify(finished.id)[0] == 0  # the database agrees with itself
    code, output = run_command("pal_verify", finished.id, "--file", path, "--public-key", tmp_path / "key.pem")
    head = run_receipt(run_id=finished.id, sign=False)["journal"]["head_seq"]
    assert code == 1 and f"seq {head} is not the receipt's head" in output


def test_a_saved_receipt_of_another_run_is_refused(finished, signing_key, tmp_path):
    other = make_run(steps=[echo_step("a")])
    drive_to_end(other)
    path = save(tmp_path, run_receipt(run_id=other.id))
    code, output = run_command("pal_verify", finished.id, "--file", path)
    assert code == 1 and f"receipt of run {other.id}, not of {finished.id}" in output


def test_a_saved_receipt_still_matches_the_database_after_more_events(finished, signing_key, tmp_path):
    from runs.services import run_event_append

    path = save(tmp_path, run_receipt(run_id=finished.id))
    run_event_append(run_id=finished.id, kind="confidence_evaluated", step_id=None, payload={"score": 1}, by="otto")
    code, output = run_command("pal_verify", finished.id, "--file", path)
    assert code == 0 and "still holds every journal head" in output
