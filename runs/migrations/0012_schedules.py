"""Schedules (runs.schedules): the Schedule table and the ScheduleEvent history of each one."""

import uuid

from django.db import migrations, models

import journal.text


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0011_run_search_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="Schedule",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ("workflow_name", models.CharField(max_length=64)),
                ("workflow_version", models.PositiveIntegerField(blank=True, null=True)),
                ("cron", models.CharField(max_length=120)),
                ("timezone", models.CharField(default="UTC", max_length=64)),
                (
                    "input",
                    models.JSONField(
                        blank=True,
                        decoder=journal.text.StorableJSONDecoder,
                        default=dict,
                        encoder=journal.text.StorableJSONEncoder,
                    ),
                ),
                ("catchup", models.CharField(choices=[("one", "One"), ("none", "None")], default="one", max_length=8)),
                ("enabled", models.BooleanField(default=True)),
                ("next_fire_at", models.DateTimeField(blank=True, null=True)),
                ("last_fired_at", models.DateTimeField(blank=True, null=True)),
                ("created_by", models.CharField(blank=True, default="", max_length=150)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "db_table": "schedules",
                "ordering": ["workflow_name", "created_at"],
            },
        ),
        migrations.CreateModel(
            name="ScheduleEvent",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("schedule_id", models.UUIDField()),
                ("kind", models.CharField(max_length=24)),
                ("fire_at", models.DateTimeField(blank=True, null=True)),
                ("run_id", models.UUIDField(blank=True, null=True)),
                ("by", models.CharField(blank=True, default="", max_length=150)),
                ("reason", models.TextField(blank=True, default="")),
                (
                    "payload",
                    models.JSONField(
                        blank=True,
                        decoder=journal.text.StorableJSONDecoder,
                        default=dict,
                        encoder=journal.text.StorableJSONEncoder,
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "db_table": "schedule_events",
                "ordering": ["-id"],
            },
        ),
        migrations.AddIndex(
            model_name="schedule",
            index=models.Index(
                condition=models.Q(("enabled", True)), fields=["next_fire_at"], name="schedules_due_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="scheduleevent",
            index=models.Index(fields=["schedule_id", "-id"], name="schedule_events_schedule_idx"),
        ),
        migrations.AddConstraint(
            model_name="scheduleevent",
            constraint=models.UniqueConstraint(
                condition=models.Q(("kind", "fired")),
                fields=("schedule_id", "fire_at"),
                name="schedule_events_one_fire",
            ),
        ),
    ]
