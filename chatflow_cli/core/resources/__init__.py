"""Resources mounted on a session: memory stores and vaults.

* :mod:`.mounts` -- a :class:`~.mounts.Mount` (kind, name, mode) and its parser.
* :mod:`.vaults` -- vaults: where their values live (the OS keyring, an owner-only file, an
  environment variable), the :class:`~.vaults.Vaults` that reads and writes them, and the
  :class:`~.vaults.SessionSecrets` a turn's tool calls are filled from.
* :mod:`.secrets` -- the vault values read by this process, and scrubbing them from text.

Nothing here imports a front-end (typer, rich, prompt_toolkit); ``keyring`` is imported only
when a vault value is read or written.
"""
