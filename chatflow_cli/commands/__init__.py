"""The commands behind ``chatflow``: each parses nothing, calls the library, formats the result.

:mod:`chatflow_cli.cli` and :mod:`chatflow_cli.sessions_app` parse the options and call one
function here; each module holds one concern (``chat``, ``sessions ls``/``show``,
``rollback``, ``delete``, ``compact``, ``interrupt``, ``search``/``fork``, export/import,
``replay``, ``agents``, ``config``, ``local``) and stands on :mod:`chatflow_cli.context`.
"""
