"""@worker declarations: what is accepted, and the errors for what is not."""

import functools

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_dbworker import Finished, worker, workers
from django_dbworker.exceptions import InvalidWorker, UnknownWorker
from tests.testapp.models import Document, Effect, Item


@pytest.fixture
def cleanup():
    names = []
    yield names
    for name in names:
        workers.remove(name)


def handler(item):
    return Finished()


def test_defaults_and_call(cleanup):
    def make_it(item):
        return Finished()

    w = worker(source=Item)(make_it)
    cleanup.append("make_it")
    assert w.name == "make_it"
    assert workers["make_it"] is w
    assert w.concurrency == 1 and w.transactional
    assert not w.takes_context
    assert w(Item()) == Finished()
    assert "make_it" in repr(w)


def test_context_signature_detected(cleanup):
    w = worker(name="with_context", source=Item)(lambda item, context: Finished())
    cleanup.append("with_context")
    assert w.takes_context


@pytest.mark.parametrize("name", ["Bad", "1st", "has-dash", "", "x" * 101, "ünï"])
def test_bad_names(name):
    with pytest.raises(InvalidWorker, match=r"\^\[a-z\]\[a-z0-9_\]\*\$"):
        worker(name=name, source=Item)(handler)


def test_duplicate_name_names_both(cleanup):
    worker(name="twice", source=Item)(handler)
    cleanup.append("twice")

    def other(item):
        return Finished()

    with pytest.raises(InvalidWorker, match="'twice' is used twice.*handler.*other"):
        worker(name="twice", source=Item)(other)


@pytest.mark.parametrize("concurrency", [0, -1, 1.5, "2", True])
def test_bad_concurrency(concurrency):
    with pytest.raises(InvalidWorker, match="concurrency=.*integer >= 1"):
        worker(name="conc", source=Item, concurrency=concurrency)(handler)


def test_source_must_be_a_model():
    with pytest.raises(InvalidWorker, match="source= must be a model class"):
        worker(name="nomodel", source=dict)(handler)


def test_composite_primary_key_refused():
    from django.db import models

    class Pair(models.Model):
        pk = models.CompositePrimaryKey("a", "b")
        a = models.IntegerField()
        b = models.IntegerField()

        class Meta:
            app_label = "testapp"

    with pytest.raises(InvalidWorker, match="no single-column primary key"):
        worker(name="pairs", source=Pair)(handler)


def test_eligible_of_another_model():
    with pytest.raises(InvalidWorker, match="QuerySet of testapp.Effect.*source is testapp.Item"):
        worker(name="wrong_model", source=Item, eligible=Effect.objects.all())(handler)


def test_eligible_sliced():
    with pytest.raises(InvalidWorker, match="sliced"):
        worker(name="sliced", source=Item, eligible=Item.objects.all()[:5])(handler)


def test_eligible_not_a_queryset():
    with pytest.raises(InvalidWorker, match="eligible= must be a QuerySet"):
        worker(name="listy", source=Item, eligible=[1, 2])(handler)


def test_eligible_callable_checked_when_built(cleanup):
    w = worker(name="lazy_wrong", source=Item, eligible=lambda: Document.objects.all())(handler)
    cleanup.append("lazy_wrong")
    with pytest.raises(InvalidWorker, match="'lazy_wrong'.*testapp.Document"):
        w.eligible_queryset()


def test_handler_signature():
    with pytest.raises(InvalidWorker, match=r"must take \(source\) or \(source, context\)"):
        worker(name="three", source=Item)(lambda a, b, c: Finished())
    with pytest.raises(InvalidWorker, match=r"must take \(source\)"):
        worker(name="none", source=Item)(lambda: Finished())


def test_a_handler_that_is_not_callable_is_refused_naming_it(cleanup):
    """``@worker(...)(5)`` raised ``AttributeError: 'int' object has no attribute
    '__module__'``; it names the value and what to decorate instead."""
    with pytest.raises(InvalidWorker, match=r"@worker\(source=Item, name='x'\) was applied "
                                            r"to 5 \(int\), not a function\. Decorate"):
        worker(source=Item, name="x")(5)
    with pytest.raises(InvalidWorker, match=r"has no __name__ .* pass name="):
        worker(source=Item)(functools.partial(handler))
    assert "x" not in workers and "partial_handler" not in workers
    named = worker(source=Item, name="partial_handler")(functools.partial(handler))
    cleanup.append("partial_handler")
    assert workers["partial_handler"] is named


def test_transactional_must_be_bool():
    with pytest.raises(InvalidWorker, match="transactional="):
        worker(name="tx", source=Item, transactional="yes")(handler)


def test_invalid_worker_is_improperly_configured():
    assert issubclass(InvalidWorker, ImproperlyConfigured)


def test_unknown_worker_names_it():
    with pytest.raises(UnknownWorker, match="No worker named 'nope'.*registered workers: .*touch"):
        workers["nope"]


def test_discovered_from_workers_modules():
    assert {"touch", "after_touch", "ranked", "loose", "read_document", "tag"} <= set(workers)
