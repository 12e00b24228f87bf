"""The REST API of docs/rest.md, in Django REST framework."""
