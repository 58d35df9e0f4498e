"""Applications: recipes (``mtlab.from_recipe``), the command line and launchers."""
