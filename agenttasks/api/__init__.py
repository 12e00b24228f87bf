"""The REST API, in Django REST framework."""
