"""``path("dbworker/", include("django_dbworker.urls"))``: health/ and metrics/.

Both answer anyone who can reach them: serve them on an internal path or protect them in
front of Django. Names are ``django_dbworker:health`` and ``django_dbworker:metrics``.
"""

from django.urls import path

from . import views

app_name = "django_dbworker"

urlpatterns = [
    path("health/", views.health, name="health"),
    path("metrics/", views.metrics, name="metrics"),
]
