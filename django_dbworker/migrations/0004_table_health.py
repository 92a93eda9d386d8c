"""Keep the queue tables healthy under constant churn.

1. A task's idempotency key is unique only where set (a partial unique index instead of
   ``unique=True``): most rows have none, and every enqueue paid for two index entries of
   NULL (the unique index and Django's ``varchar_pattern_ops`` twin).
2. PostgreSQL only: storage parameters for the two tables whose rows are claimed, renewed
   and finished all day (see docs/operating.md, "Table health"). Autovacuum's defaults
   wait for 20% of a table to be dead before vacuuming it: on a table of 1,000,000
   finished rows that is 200,000 dead row versions on the claim path's pages. Here it
   vacuums after 1% (plus 1,000 rows) and analyses after 2%, and leaves 10% of each page
   free so that an update can often keep the new row version on the same page. (Our
   updates are not HOT: claims and completions change the status the partial indexes
   filter on, so every update adds index entries; vacuum is what keeps them in check.)
"""

from django.db import migrations, models

TABLES = ("django_dbworker_execution", "django_dbworker_taskrecord")
PARAMETERS = {
    "fillfactor": 90,
    "autovacuum_vacuum_scale_factor": 0.01,
    "autovacuum_vacuum_threshold": 1000,
    "autovacuum_vacuum_insert_scale_factor": 0.05,
    "autovacuum_analyze_scale_factor": 0.02,
}


def set_storage(apps, schema_editor):
    # The database's engine applies them where it has such parameters (PostgreSQL).
    from django_dbworker.db import engine_for

    engine_for(schema_editor.connection).set_table_storage(schema_editor, TABLES, PARAMETERS)


def reset_storage(apps, schema_editor):
    from django_dbworker.db import engine_for

    engine_for(schema_editor.connection).reset_table_storage(schema_editor, TABLES, PARAMETERS)


class Migration(migrations.Migration):

    dependencies = [
        ("django_dbworker", "0003_supervisor"),
    ]

    operations = [
        migrations.AlterField(
            model_name="taskrecord",
            name="idempotency_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddConstraint(
            model_name="taskrecord",
            constraint=models.UniqueConstraint(
                condition=models.Q(("idempotency_key__isnull", False)),
                fields=("idempotency_key",),
                name="dbworker_task_idempotency_key",
            ),
        ),
        migrations.RunPython(set_storage, reset_storage, elidable=False),
    ]
