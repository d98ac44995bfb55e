from django.contrib import admin
from django.urls import path

from pal.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
]
