"""URLs of the agenttasks REST API; include them where the API should live."""

app_name = "agenttasks"
urlpatterns: list = []
