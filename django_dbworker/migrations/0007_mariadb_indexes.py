"""MariaDB and MySQL: the indexes, the unique constraint and the key collations the other
two databases already have (``django_dbworker.db.partial``). Elsewhere it changes only
the migration state: the same indexes, constraint and columns, under new classes."""

from django.db import migrations, models

import django_dbworker.db.partial


class Migration(migrations.Migration):

    dependencies = [
        ('django_dbworker', '0006_sweep_state'),
    ]

    operations = [
        django_dbworker.db.partial.WherePartialIndexesLack(operations=[
            migrations.AlterField(
                model_name='execution',
                name='source_id',
                field=django_dbworker.db.partial.KeyField(max_length=255),
            ),
            migrations.AlterField(
                model_name='taskrecord',
                name='idempotency_key',
                field=django_dbworker.db.partial.KeyField(blank=True, max_length=255, null=True),
            ),
            migrations.AlterField(
                model_name='ratebucket',
                name='key',
                field=django_dbworker.db.partial.KeyField(max_length=255, primary_key=True, serialize=False),
            ),
            migrations.RemoveIndex(model_name='execution', name='dbworker_execution_claimable'),
            migrations.RemoveIndex(model_name='execution', name='dbworker_execution_working'),
            migrations.RemoveIndex(model_name='taskrecord', name='dbworker_task_claimable'),
            migrations.RemoveIndex(model_name='taskrecord', name='dbworker_task_claimable_any'),
            migrations.RemoveIndex(model_name='taskrecord', name='dbworker_task_running'),
            migrations.RemoveIndex(model_name='taskrecord', name='dbworker_task_finished'),
            migrations.RemoveConstraint(model_name='taskrecord', name='dbworker_task_idempotency_key'),
            migrations.AddIndex(
                model_name='execution',
                index=django_dbworker.db.partial.PartialIndex(condition=models.Q(('state__in', ('PENDING', 'UNFINISHED'))), fields=['worker', 'sort_key', 'source_id'], flag='dbworker_claimable', name='dbworker_execution_claimable'),
            ),
            migrations.AddIndex(
                model_name='execution',
                index=django_dbworker.db.partial.PartialIndex(condition=models.Q(('state', 'WORKING')), fields=['lease_expires_at'], flag='dbworker_working', name='dbworker_execution_working'),
            ),
            migrations.AddIndex(
                model_name='taskrecord',
                index=django_dbworker.db.partial.PartialIndex(fields=['queue_name', '-priority', 'available_at'], condition=models.Q(('status__in', ('READY', 'RETRYING'))), flag='dbworker_claimable', name='dbworker_task_claimable'),
            ),
            migrations.AddIndex(
                model_name='taskrecord',
                index=django_dbworker.db.partial.PartialIndex(fields=['-priority', 'available_at'], condition=models.Q(('status__in', ('READY', 'RETRYING'))), flag='dbworker_claimable', name='dbworker_task_claimable_any'),
            ),
            migrations.AddIndex(
                model_name='taskrecord',
                index=django_dbworker.db.partial.PartialIndex(condition=models.Q(('status', 'RUNNING')), fields=['lease_expires_at'], flag='dbworker_running', name='dbworker_task_running'),
            ),
            migrations.AddIndex(
                model_name='taskrecord',
                index=django_dbworker.db.partial.PartialIndex(condition=models.Q(('status__in', ('SUCCESSFUL', 'FAILED', 'CANCELLED'))), fields=['finished_at'], flag='dbworker_finished', name='dbworker_task_finished'),
            ),
            migrations.AddConstraint(
                model_name='taskrecord',
                constraint=django_dbworker.db.partial.UniqueUnlessNull(condition=models.Q(('idempotency_key__isnull', False)), fields=('idempotency_key',), name='dbworker_task_idempotency_key'),
            ),
        ]),
    ]
