"""The layers of mtlab, bottom first: each is a folder, and a module imports only its own layer or one below.

``tests/integration/test_layering.py`` checks every import against this order and fails on an upward one; the README's
Architecture section is checked against it too. A folder not listed here fails that test.
"""

from __future__ import annotations

LAYERS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("foundations", ("base",), "errors, batch collation, gradient ops, plug-in registry, HTML reports"),
    ("describing work", ("tasks", "models", "losses"),
     "a task's graph, its linked sets, sampling, the one checked forward + loss; model blocks; losses"),
    ("step core", ("core",),
     "accumulators, gradient transforms, the update and its combination plug-ins, events, history, trainer"),
    ("training", ("training",),
     "the run loop (schedule, validation, run), checkpoints, data parallelism, loggers, plots, debugging"),
    ("data", ("data",), "speech corpora: lists, audio, features, layouts"),
    ("domains", ("separation", "nabu"), "speech separation; the Nabu-MSSS importer"),
    ("applications", ("apps", "remote"), "recipes, the command line, launchers; attaching to a running job"),
    ("notebook UI", ("ui",), "the dashboard (ipywidgets, matplotlib)"),
)


def layer_of(folder: str) -> int | None:
    """The index of the layer a top-level folder of mtlab belongs to (None: not a layer folder)."""
    for index, (_, folders, _) in enumerate(LAYERS):
        if folder in folders:
            return index
    return None
