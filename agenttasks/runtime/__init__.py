"""Agent runtimes: the run driver, callable handlers, the chat loop and its tools."""
