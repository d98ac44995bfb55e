import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management.base import BaseCommand, CommandError

from journal.receipts import key_id, public_key_pem


class Command(BaseCommand):
    help = (
        "Print a new Ed25519 private key (PEM) for signing receipts, to put in PAL_RECEIPT_PRIVATE_KEY, or "
        "with --out write it to a file (mode 0600) for PAL_RECEIPT_PRIVATE_KEY_FILE."
    )

    def add_arguments(self, parser):
        parser.add_argument("--out", metavar="FILE", help="write the private key here (refuses to overwrite)")

    def handle(self, *args, out=None, **options):
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        if not out:
            self.stdout.write(pem.decode(), ending="")
            return
        path = Path(out)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise CommandError(
                f"{out} exists already; a new key would make every receipt signed so far "
                f"unverifiable with the key served then. Remove it first if you mean it."
            ) from None
        except OSError as exc:
            raise CommandError(f"cannot write {out}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
        self.stdout.write(
            f"wrote a new receipt signing key to {out} (mode 0600), key id {key_id(key.public_key())}; "
            f"set PAL_RECEIPT_PRIVATE_KEY_FILE={path.resolve()}. Its public key:"
        )
        self.stdout.write(public_key_pem(key.public_key()), ending="")
