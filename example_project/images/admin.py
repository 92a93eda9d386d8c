from django.contrib import admin, messages

from django_dbworker import workers

from .models import Artifact, DuplicatePair, Image


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "uploaded_at"]
    search_fields = ["name"]
    actions = ["retry_prepare"]

    @admin.action(description="Retry prepare_image where it FAILED", permissions=["change"])
    def retry_prepare(self, request, queryset):
        reset = sum(workers["prepare_image"].reset_failed(pk)
                    for pk in queryset.values_list("pk", flat=True))
        self.message_user(request, f"{reset} image(s) will be prepared again.", messages.SUCCESS)


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ["image", "width", "height", "format", "dhash", "compared_up_to"]
    exclude = ["thumbnail"]


@admin.register(DuplicatePair)
class DuplicatePairAdmin(admin.ModelAdmin):
    list_display = ["image", "original", "distance", "found_at"]
