"""tietool's command line (Typer). Thin: parse options, call :mod:`surgery`, render with :mod:`cli.render`."""
