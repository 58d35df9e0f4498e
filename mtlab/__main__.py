"""``python -m mtlab ...``: the command line (see ``mtlab.cli``)."""

from .apps.cli import main

raise SystemExit(main())
