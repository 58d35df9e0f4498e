"""``python -m mtlab ...``: the command line (see ``mtlab.cli``)."""

from .cli import main

raise SystemExit(main())
