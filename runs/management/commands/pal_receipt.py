import json
import uuid
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from journal.text import utf8_safe_json
from runs.receipts import run_receipt
from runs.services import NotFound


class Command(BaseCommand):
    help = (
        "Write the receipt of RUN_ID (its child runs nested) as JSON, signed with PAL_RECEIPT_PRIVATE_KEY when "
        "one is configured; check it later with `pal_verify --file FILE --public-key KEY.pem`."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--out", metavar="FILE", help="write here instead of standard output")

    def handle(self, *args, run_id, out=None, **options):
        try:
            uuid.UUID(run_id)
            receipt = run_receipt(run_id=run_id)
        except (ValueError, NotFound):
            raise CommandError(f"run {run_id} does not exist") from None
        text = utf8_safe_json(json.dumps(receipt, ensure_ascii=False, indent=2)) + "\n"
        if out:
            try:
                Path(out).write_text(text, encoding="utf-8")
            except OSError as exc:
                raise CommandError(f"cannot write {out}: {exc.strerror or exc}") from None
        else:
            self.stdout.write(text, ending="")
        if settings.PAL_RECEIPT_PRIVATE_KEY is None:
            self.stderr.write(
                "the receipt is NOT signed: no key is configured (PAL_RECEIPT_PRIVATE_KEY or "
                "PAL_RECEIPT_PRIVATE_KEY_FILE; `manage.py pal_receipt_key` makes one)"
            )
        elif out:
            self.stderr.write(
                f"wrote the receipt of run {run_id} to {out}, signed by key {receipt['signed']['key_id']}"
            )
