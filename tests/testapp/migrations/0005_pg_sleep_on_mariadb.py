"""``pg_sleep(seconds)`` on MariaDB/MySQL too (slow_sql.py registers it on SQLite): a stored
function that sleeps inside the database and returns 0."""

from django.db import migrations


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("DROP FUNCTION IF EXISTS pg_sleep")
        cursor.execute(
            "CREATE FUNCTION pg_sleep(seconds DOUBLE) RETURNS INT NOT DETERMINISTIC NO SQL "
            "BEGIN DO SLEEP(seconds); RETURN 0; END")


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "mysql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("DROP FUNCTION IF EXISTS pg_sleep")


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('testapp', '0004_slow'),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
