"""``python -m chatflow_cli`` runs the ``chatflow`` command line."""

from chatflow_cli.cli import main

if __name__ == "__main__":
    main()
