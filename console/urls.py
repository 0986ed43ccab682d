from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import include, path

# Django's form views also take PUT (as POST, with an empty form): a form here is sent with POST.
FORM_METHODS = ["get", "post", "head", "options"]

urlpatterns = [
    path("api/", include("console.api.urls")),
    path("accounts/login/", auth_views.LoginView.as_view(http_method_names=FORM_METHODS), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # A signed-in user's own password (a member added on Settings → Members starts with a
    # one-time one): Django's views, which ask for the current password and keep the session.
    path(
        "accounts/password/",
        auth_views.PasswordChangeView.as_view(http_method_names=FORM_METHODS),
        name="password_change",
    ),
    path("accounts/password/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
    path("", include("console.pages.concepts")),
    path("", include("console.pages.runs")),
    # Before the run page: its `<tab>/` route would take `reexecute/` for a tab name.
    path("", include("console.pages.reexecution")),
    # Also before it: `share-links/` and `share-policy/` would be taken for tab names.
    path("", include("console.pages.share")),
    path("", include("console.pages.run")),
    path("", include("console.pages.loop")),
    path("", include("console.pages.approvals")),
    path("", include("console.pages.evaluations")),
    path("", include("console.pages.audit")),
    path("", include("console.pages.usage")),
    path("", include("console.pages.settings")),
    path("", include("console.pages.members")),
    path("", include("console.pages.prices")),
    path("", include("console.pages.redaction")),
]

# The console's own error pages, in its layout with a way back (console/pages/errors.py).
handler400 = "console.pages.errors.bad_request"
handler403 = "console.pages.errors.permission_denied"
handler404 = "console.pages.errors.page_not_found"
handler500 = "console.pages.errors.server_error"
