"""The Agent Card of one agent (docs/a2a.md#discovery), built as the SDK's AgentCard."""

from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import PROTOCOL_VERSION_1_0, TransportProtocol
from django.utils.module_loading import import_string
from rest_framework.settings import api_settings

from .. import __version__
from ..conf import app_settings
from ..store import files

TEXT = "text/plain"
JSON = "application/json"


def _http(scheme: str, description: str, bearer_format: str = "") -> pb.SecurityScheme:
    return pb.SecurityScheme(
        http_auth_security_scheme=pb.HTTPAuthSecurityScheme(
            scheme=scheme, description=description, bearer_format=bearer_format
        )
    )


def _api_key(location: str, name: str, description: str) -> pb.SecurityScheme:
    return pb.SecurityScheme(
        api_key_security_scheme=pb.APIKeySecurityScheme(
            location=location, name=name, description=description
        )
    )


def security_schemes() -> dict[str, pb.SecurityScheme]:
    """Return the authentication the site accepts (the classes the REST API uses), as schemes."""
    classes = app_settings.AUTHENTICATION_CLASSES
    if classes is None:
        classes = api_settings.DEFAULT_AUTHENTICATION_CLASSES
    out = {}
    for entry in classes:
        cls = import_string(entry) if isinstance(entry, str) else entry
        names = {c.__name__ for c in cls.__mro__}
        if "TokenAuthentication" in names:
            keyword = getattr(cls, "keyword", "Token")
            out["token"] = _api_key(
                "header", "Authorization", f'DRF token: "Authorization: {keyword} <key>"'
            )
        elif "BasicAuthentication" in names:
            out["basic"] = _http("Basic", "HTTP Basic with the site's user name and password")
        elif "SessionAuthentication" in names:
            out["session"] = _api_key("cookie", "sessionid", "A logged-in Django session")
        elif "JWTAuthentication" in names:
            out["bearer"] = _http("Bearer", "A JSON Web Token", "JWT")
        else:
            out[cls.__name__] = _http("Bearer", f"{cls.__module__}.{cls.__name__}")
    return out


def input_modes(agent) -> list[str]:
    modes = [TEXT, JSON]
    rules = files.policy(agent)
    if rules.get("enabled"):
        modes += list(rules.get("allowedTypes") or ["*/*"])
    return modes


def agent_card(agent, base_url: str) -> pb.AgentCard:
    """Return the card: both interfaces at `base_url` (the agent's A2A root, no trailing slash)."""
    schemes = security_schemes()
    card = pb.AgentCard(
        name=agent.name or agent.id,
        description=agent.does or agent.name or agent.id,
        version=__version__,
        supported_interfaces=[
            pb.AgentInterface(
                url=f"{base_url}/",
                protocol_binding=TransportProtocol.JSONRPC.value,
                protocol_version=PROTOCOL_VERSION_1_0,
            ),
            pb.AgentInterface(
                url=f"{base_url}/rest",
                protocol_binding=TransportProtocol.HTTP_JSON.value,
                protocol_version=PROTOCOL_VERSION_1_0,
            ),
        ],
        capabilities=pb.AgentCapabilities(streaming=True, push_notifications=True),
        default_input_modes=input_modes(agent),
        default_output_modes=[TEXT],
        skills=[
            pb.AgentSkill(
                id=agent.id,
                name=agent.name or agent.id,
                description=agent.does or agent.name or agent.id,
                tags=["agenttasks", agent.runtime],
                input_modes=input_modes(agent),
                output_modes=[TEXT],
            )
        ],
    )
    for name, scheme in schemes.items():
        card.security_schemes[name].CopyFrom(scheme)
        requirement = card.security_requirements.add()
        requirement.schemes[name].SetInParent()
    return card
