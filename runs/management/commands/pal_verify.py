import json
import uuid
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from journal.receipts import BadKey, public_key_load
from runs.receipts import receipt_against_database, receipt_file_verify, run_verify
from runs.services import NotFound


class Command(BaseCommand):
    help = (
        "pal_verify RUN_ID: recompute the hash chain of the run and of its child runs from the database, check it "
        "against the journal head recorded when each run ended and the run rows against a freshly built receipt. "
        "pal_verify --file receipt.json --public-key key.pem: check a saved receipt offline (its Ed25519 signature "
        "over the canonical form, and its sums); with RUN_ID too, also that the database still holds the journal "
        "heads it names. Exit 0 with one line OK when it holds; otherwise exit 1 naming the first seq that does not."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id", nargs="?")
        parser.add_argument("--file", metavar="RECEIPT.json", help="a receipt saved by pal_receipt or the API")
        parser.add_argument(
            "--public-key",
            metavar="KEY.pem",
            help="the PEM public key (GET /api/v1/receipts/public-key); default: the configured key's",
        )

    def handle(self, *args, run_id=None, file=None, public_key=None, **options):
        if not run_id and not file:
            raise CommandError("give a RUN_ID, or --file RECEIPT.json (with --public-key KEY.pem)")
        if run_id:
            try:
                uuid.UUID(run_id)
            except ValueError:
                raise CommandError(f"run {run_id} does not exist (not a run id)") from None
        if file:
            return self.verify_file(file, public_key, run_id)
        try:
            result = run_verify(run_id=run_id)
        except NotFound:
            raise CommandError(f"run {run_id} does not exist") from None
        if not result.ok:
            self.fail(result.problem, run_id)
        children = result.runs - 1
        note = f"; note: {result.notes[0]}" if result.notes else ""
        self.stdout.write(
            f"OK run {run_id}: {result.events} journal rows in {result.runs} run(s) chain without a break"
            f"{f' ({children} child run(s))' if children else ''}; head seq {result.head_seq} "
            f"{result.head_hash[:16]}… matches the recorded head and the receipt{note}"
        )

    def fail(self, problem, root_id):
        where = f"run {problem.run_id}" + ("" if problem.run_id == str(root_id) else f" (in the tree of {root_id})")
        self.stderr.write(f"FAILED {where}: {problem.reason}")
        raise SystemExit(1)

    def verify_file(self, file, public_key_path, run_id):
        try:
            receipt = json.loads(Path(file).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CommandError(f"receipt file {file} does not exist") from None
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc.strerror or exc}") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise CommandError(f"{file} is not JSON: {exc}") from None
        key = self.load_key(public_key_path)
        problem = receipt_file_verify(receipt, key)
        if problem:
            self.stderr.write(f"FAILED {file}: {problem}")
            raise SystemExit(1)
        head = receipt["journal"]
        line = (
            f"OK {file}: receipt of run {receipt['run_id']} signed by key {receipt['signed']['key_id'][:16]}…, "
            f"head seq {head['head_seq']} {head['head_hash'][:16]}…"
        )
        if run_id:
            if str(receipt.get("run_id")) != str(uuid.UUID(run_id)):
                self.stderr.write(f"FAILED {file}: it is the receipt of run {receipt.get('run_id')}, not of {run_id}")
                raise SystemExit(1)
            mismatch = receipt_against_database(receipt)
            if mismatch:
                self.fail(mismatch, run_id)
            line += "; the database still holds every journal head it names"
        self.stdout.write(line)

    def load_key(self, path):
        if path is None:
            private = settings.PAL_RECEIPT_PRIVATE_KEY
            if private is None:
                raise CommandError("give --public-key KEY.pem (no signing key is configured here to take it from)")
            return private.public_key()
        try:
            pem = Path(path).read_bytes()
        except FileNotFoundError:
            raise CommandError(f"public key file {path} does not exist") from None
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            return public_key_load(pem, name=path)
        except BadKey as exc:
            raise CommandError(str(exc)) from None
