from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView

from pal.api import api
from pal.views import permission_denied, server_error
from runs.metrics import metrics_view

urlpatterns = [
    path("", RedirectView.as_view(url="/runs/", permanent=False)),
    path("admin/", admin.site.urls),
    path("api/v1/metrics", metrics_view, name="metrics"),  # Prometheus text, not JSON: outside ninja
    path("api/v1/", api.urls),
    path("metrics", metrics_view),  # where a Prometheus scrape config looks by default
    path("accounts/login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("runs.urls")),
]

handler403 = permission_denied
handler500 = server_error
