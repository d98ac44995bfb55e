from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0009_run_forked_from"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["workflow", "-created_at"], name="runs_workflow_created_idx"),
        ),
    ]
