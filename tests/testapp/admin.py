from django.contrib import admin

from django_dbworker.admin import WorkerStatusMixin

from .models import Item


@admin.register(Item)
class ItemAdmin(WorkerStatusMixin, admin.ModelAdmin):
    list_display = ["id", "kind", "action"]
    dbworker_workers = ["touch", "after_touch"]
