from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [("benchapp", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="Ping",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("started", models.FloatField(null=True)),
            ],
        ),
    ]
