from django.urls import path

from . import views

urlpatterns = [
    path("", views.index, name="index"),
    path("upload/", views.upload, name="upload"),
    path("images/<int:pk>/thumbnail.png", views.thumbnail, name="thumbnail"),
    path("api/images/", views.api_images, name="api-images"),
    path("api/images/<int:pk>/", views.api_image, name="api-image"),
    path("api/duplicates/", views.api_duplicates, name="api-duplicates"),
]
