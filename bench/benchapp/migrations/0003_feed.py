from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [("benchapp", "0002_ping")]

    operations = [
        migrations.CreateModel(
            name="Feed",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("payload", models.CharField(default="", max_length=64)),
            ],
        ),
    ]
