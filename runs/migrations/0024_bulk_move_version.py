from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0023_sweep_started_by_the_database"),
    ]

    operations = [
        migrations.AddField(
            model_name="bulkaction",
            name="version",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
