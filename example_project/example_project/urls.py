from django.conf import settings
from django.conf.urls.static import static
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # django_dbworker's health check and Prometheus metrics: dbworker/health/ and
    # dbworker/metrics/. They answer anyone; a real site serves them on an internal path.
    path("dbworker/", include("django_dbworker.urls")),
    path("", include("images.urls")),
    *static(settings.MEDIA_URL, document_root=settings.MEDIA_ROOT),  # only when DEBUG
]
