"""Indexes for the operator's surfaces at millions of units (issue 39): the admin's lists
newest first (unfiltered, by task, by an end status), the last minutes' completions of the
executions. The indexes by status hold only the statuses no claim or reaper reads
(``SETTLED``, ``TASK_SETTLED``): on MariaDB and MySQL behind a new flag column."""

import django_dbworker.db.flag_migrations
import django_dbworker.db.partial
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_dbworker', '0010_workflows'),
    ]

    operations = [
        django_dbworker.db.flag_migrations.AddFlaggedIndex(
            model_name='execution',
            index=django_dbworker.db.partial.PartialIndex(condition=models.Q(('state__in', ('FINISHED', 'FAILED'))), fields=['state', 'id'], flag='dbworker_settled', name='dbworker_execution_state'),
        ),
        migrations.AddIndex(  # its flag column was added with the index above
            model_name='execution',
            index=django_dbworker.db.partial.PartialIndex(condition=models.Q(('state__in', ('FINISHED', 'FAILED'))), fields=['state', 'worker', 'id'], flag='dbworker_settled', name='dbworker_execution_settled'),
        ),
        migrations.AddIndex(
            model_name='execution',
            index=models.Index(fields=['finished_at'], name='dbworker_execution_finished_at'),
        ),
        migrations.AddIndex(
            model_name='taskrecord',
            index=models.Index(fields=['enqueued_at', 'id'], name='dbworker_task_enqueued'),
        ),
        django_dbworker.db.flag_migrations.AddFlaggedIndex(
            model_name='taskrecord',
            index=django_dbworker.db.partial.PartialIndex(condition=models.Q(('status__in', ('WAITING', 'SUCCESSFUL', 'FAILED', 'CANCELLED'))), fields=['status', 'enqueued_at', 'id'], flag='dbworker_settled', name='dbworker_task_status'),
        ),
        migrations.AddIndex(
            model_name='taskrecord',
            index=models.Index(fields=['task_path', 'enqueued_at', 'id'], name='dbworker_task_path'),
        ),
        migrations.AddIndex(
            model_name='taskrecord',
            index=models.Index(fields=['unique_key'], name='dbworker_task_unique_key'),
        ),
    ]
