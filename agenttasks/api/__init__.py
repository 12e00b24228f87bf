"""The REST API of spec/rest.md, in Django REST framework."""
