import pytest

from django_dbworker import ExecutionStatus, execution_status
from django_dbworker.testing import run_until_idle
from tests.testapp.models import Effect, Item


@pytest.mark.django_db(transaction=True)
def test_smoke():
    items = [Item.objects.create() for _ in range(3)]
    counts = run_until_idle(["touch", "after_touch"])
    assert counts["finished"] == 6, counts
    assert execution_status(worker="touch", source_id=items[0].pk) == ExecutionStatus.FINISHED
    assert Effect.objects.count() == 6
