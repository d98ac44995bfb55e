from django.core.management.base import BaseCommand

from runs.recovery import sweep_once


class Command(BaseCommand):
    help = "Run one recovery sweep now: re-drive queued or running runs that have no live lease."

    def handle(self, *args, **options):
        record = sweep_once(who="pal_sweep")
        self.stdout.write(f"examined {record.examined} run(s) without a live lease; re-drove {len(record.redriven)}")
        for run_id in record.redriven:
            self.stdout.write(f"  {run_id}")
