from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0008_item_step_ids"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="forked_from",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=models.deletion.PROTECT,
                related_name="forks",
                to="runs.run",
            ),
        ),
    ]
