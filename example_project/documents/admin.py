from django.contrib import admin

from .models import Document, IndexEntry, Summary


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    list_display = ["id", "title", "created"]


@admin.register(Summary)
class SummaryAdmin(admin.ModelAdmin):
    list_display = ["document", "word_count", "top_words"]


@admin.register(IndexEntry)
class IndexEntryAdmin(admin.ModelAdmin):
    list_display = ["word", "document"]
    search_fields = ["word"]
