"""Agent runtimes: the registry, callable handlers, the chat loop and the model-facing tools."""
