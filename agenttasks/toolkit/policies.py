"""The policies every surface's views share, whatever the host's REST_FRAMEWORK defaults say."""

from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer
from rest_framework.views import APIView

from . import body
from .identity import IdentityRequired, authenticators
from .throttling import throttles_for


class FirstRenderer(BaseContentNegotiation):
    """No content negotiation: the app always answers JSON, so never a 406."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class AppPolicies(APIView):
    """The app's own policies, whatever the host's REST_FRAMEWORK defaults say (REST, A2A and MCP).

    The site's authenticators (AGENTTASKS["AUTHENTICATION_CLASSES"] or DRF's default), the
    identity rule, the app's throttles, bodies read by toolkit.body, and JSON without negotiation.
    """

    anonymous_list = False
    parser_classes = [body.Unread]  # bodies are read by toolkit.body, before any view logic
    renderer_classes = [JSONRenderer]
    content_negotiation_class = FirstRenderer
    metadata_class = None

    def get_authenticators(self):
        return authenticators()

    def get_permissions(self):
        return [IdentityRequired()]

    def get_throttles(self):
        return throttles_for(self.request)
