"""A site's agents module as the README's recipe writes it: importing it registers its agent."""

from agenttasks import registry
from agenttasks.runtime.base import Reply


def summarize(ctx):
    return Reply(content="summary")


registry.register("summarize", runtime="callable", handler=summarize)
