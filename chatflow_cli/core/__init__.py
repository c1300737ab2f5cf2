"""chatflow's session library: messages, sessions and stores, the event log, agents, tools and the Runner.

Nothing in this package imports typer, rich, prompt_toolkit or llama_cpp; ``openai`` is
imported only inside :mod:`chatflow_cli.core.model`, when a request is made.
"""
