import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from runs.models import Workflow
from runs.services import workflow_create
from runs.workflows import WorkflowInvalid


class Command(BaseCommand):
    help = (
        "Load workflow definitions (JSON files); a changed definition becomes a new version, an unchanged one is left."
    )

    def add_arguments(self, parser):
        parser.add_argument("paths", nargs="*", help="files or folders (default: workflows/)")

    def handle(self, *args, paths, **options):
        files = []
        for raw in paths or [str(settings.BASE_DIR / "workflows")]:
            path = Path(raw)
            files += sorted(path.glob("*.json")) if path.is_dir() else [path]
        for file in files:
            try:
                definition = json.loads(file.read_text())
            except (OSError, ValueError) as exc:
                raise CommandError(f"{file}: {exc}") from None
            latest = Workflow.objects.filter(name=definition.get("name")).order_by("-version").first()
            if latest and latest.definition == definition:
                self.stdout.write(f"{file.name}: {latest} unchanged")
                continue
            try:
                workflow = workflow_create(definition=definition)
            except WorkflowInvalid as exc:
                raise CommandError(f"{file}: {exc}") from None
            self.stdout.write(f"{file.name}: loaded {workflow}")
