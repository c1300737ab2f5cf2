"""The commands behind ``chatflow``: each parses nothing, calls the library, formats the result.

:mod:`chatflow_cli.cli` parses the options and calls one function here; each module holds
one concern (``chat``, ``sessions ls``/``show``, ``rollback``, ``delete``, ``replay``,
``agents``, ``config``, ``local``) and stands on :mod:`chatflow_cli.context`.
"""
