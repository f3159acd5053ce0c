"""``python -m tietool``: the command line, as the ``tietool`` script."""

from .cli.app import main

main()
