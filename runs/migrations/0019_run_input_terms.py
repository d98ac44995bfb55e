"""run_input_terms: runs indexed by the top-level members of their input, for the `input` filter's first page
(runs.input_terms), filled for the runs that exist: one INSERT ... SELECT on Postgres (about 4 rows a run), in
chunks through Python on SQLite."""

import django.db.models.deletion
from django.db import migrations, models

CHUNK = 2000


def fill(apps, schema_editor):
    from runs import input_terms

    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(input_terms.terms_sql("runs r"))
        return
    Run = apps.get_model("runs", "Run")
    Term = apps.get_model("runs", "RunInputTerm")
    last = None
    while True:
        page = Run.objects.order_by("id")
        if last is not None:
            page = page.filter(id__gt=last)
        rows = list(page.values_list("id", "created_at", "input")[:CHUNK])
        if not rows:
            return
        Term.objects.bulk_create(
            Term(term=term, created_at=created_at, run_id=run_id)
            for run_id, created_at, input in rows
            for term in input_terms.terms_of(input)
        )
        last = rows[-1][0]


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0018_workflow_rollups"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunInputTerm",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "term", "created_at", "run", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("term", models.BigIntegerField()),
                ("created_at", models.DateTimeField()),
                (
                    "run",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="input_terms",
                        to="runs.run",
                    ),
                ),
            ],
            options={
                "db_table": "run_input_terms",
            },
        ),
        migrations.RunPython(fill, migrations.RunPython.noop, elidable=True),
    ]
