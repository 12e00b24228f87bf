"""`runserver` for the demo: a request that names no content type reaches the app without one.

wsgiref, under runserver, fills in `text/plain` when a request has no Content-Type header, so
`curl -d '{…}'` would be refused 415 although the API reads a body without a type as JSON.
"""

from django.contrib.staticfiles.management.commands.runserver import Command as RunserverCommand
from django.core.servers.basehttp import WSGIRequestHandler, WSGIServer


class UntypedRequestHandler(WSGIRequestHandler):
    """Leave CONTENT_TYPE out of the environment when the request did not send one."""

    def get_environ(self):
        environ = super().get_environ()
        if self.headers.get("Content-Type") is None:
            environ.pop("CONTENT_TYPE", None)
        return environ


class Server(WSGIServer):
    """runserver's server with the handler above (runserver names its handler class itself)."""

    def __init__(self, address, handler_class, *args, **kwargs):
        super().__init__(address, UntypedRequestHandler, *args, **kwargs)


class Command(RunserverCommand):
    server_cls = Server
