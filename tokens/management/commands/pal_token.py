from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from tokens.services import token_create_for_username


class Command(BaseCommand):
    help = "Print a new API token for USERNAME (alone on the last line). Only its hash is stored: keep it now."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="what the token is for (shown in the admin)")

    def handle(self, *args, username, name, **options):
        try:
            row, token = token_create_for_username(username=username, name=name)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user named {username!r}") from None
        self.stdout.write(
            f"New API token {row.prefix}… for {username}"
            f"{' (' + name + ')' if name else ''}. It is shown once; send it as 'Authorization: Bearer <token>'."
        )
        self.stdout.write(token)
