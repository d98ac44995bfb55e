from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from tokens.services import token_create_for_username, token_lifetime


class Command(BaseCommand):
    help = "Print a new API token for USERNAME (alone on the last line). Only its hash is stored: keep it now."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="what the token is for (shown in the admin)")
        parser.add_argument("--expires", default="", metavar="30d", help="refuse it after this long: 90m, 12h, 30d, 2w")

    def handle(self, *args, username, name, expires, **options):
        try:
            lifetime = token_lifetime(expires) if expires else None
        except ValueError as exc:
            raise CommandError(f"--expires: {exc}") from None
        try:
            row, token = token_create_for_username(username=username, name=name, expires_in=lifetime)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user named {username!r}") from None
        until = f", expiring {row.expires_at:%Y-%m-%d %H:%M} UTC" if row.expires_at else ""
        self.stdout.write(
            f"New API token {row.prefix}… for {username}{' (' + name + ')' if name else ''}{until}. "
            "It is shown once; send it as 'Authorization: Bearer <token>'."
        )
        self.stdout.write(token)
