from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.contrib.staticfiles.urls import staticfiles_urlpatterns
from django.urls import include, path

from . import views

urlpatterns = [
    path("api/", include("ledger.api.urls")),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.runs_list, name="runs"),
    path("w/<slug:tenant>/<slug:workspace>/", views.runs_list, name="workspace-runs"),
    path("w/<slug:tenant>/<slug:workspace>/runs/<str:run_id>/", views.run_detail, name="run"),
]
# Daphne does not serve static files itself; the console serves its own few (no CDN, no build).
urlpatterns += staticfiles_urlpatterns()
