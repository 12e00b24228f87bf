from django.contrib import admin
from django.contrib.auth.views import LogoutView
from django.urls import include, path

from .views import favicon, home, sign_in

urlpatterns = [
    path("", home, name="home"),
    path("favicon.ico", favicon, name="favicon"),
    path("login/", sign_in, name="login"),
    path("logout/", LogoutView.as_view(next_page="login"), name="logout"),
    path("admin/", admin.site.urls),
    path("api/agents/", include("agenttasks.urls")),
]
