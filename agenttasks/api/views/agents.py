"""The agents exposed over REST (docs/rest.md#agents)."""

from rest_framework.response import Response

from ... import registry
from .. import serializers as s
from .base import ApiView, exposed_agent, extend_schema, refusals


class AgentListView(ApiView):
    @extend_schema(
        operation_id="listAgents",
        tags=["Agents"],
        summary="List the agents exposed over REST",
        responses={200: s.AgentListSerializer, **refusals()},
    )
    def get(self, request):
        agents = [a for a in registry.agents() if a.expose]
        return Response({"agents": [s.AgentSerializer.present(a) for a in agents]})


class AgentView(ApiView):
    @extend_schema(
        operation_id="getAgent",
        tags=["Agents"],
        summary="Read one agent",
        responses={200: s.AgentEnvelopeSerializer, **refusals(404)},
    )
    def get(self, request, agentId):
        agent = exposed_agent(agentId)
        return Response({"agent": s.AgentSerializer.present(agent)})
