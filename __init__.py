"""tietool: surgery on the input embedding and LM head of PaddlePaddle LLM checkpoints.

The installed package is laid out as the repository is: :mod:`tietool.surgery` (the library, no paddle),
:mod:`tietool.cli` (the Typer app). ``python -m tietool`` runs the command line. Importing this package
is cheap (no numpy, no paddle): ``tietool --help`` goes through it.
"""

from .surgery import __version__

__all__ = ["__version__"]
