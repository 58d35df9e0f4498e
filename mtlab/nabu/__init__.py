"""Original Nabu-MSSS recipes in mtlab: ``import_nabu(recipe_dir, data_root)`` reads an original
recipe folder into an mtlab recipe dict (``recipe["nabu"]`` holds what the plain schema has no place
for); ``write_toml(recipe, path)`` writes it out (``mtlab import-nabu RECIPE_DIR -o recipe.toml``)."""

from .importer import import_nabu, plain_recipe
from .samples import make_sample_root
from .toml import toml_text, write_toml

__all__ = ["import_nabu", "make_sample_root", "plain_recipe", "toml_text", "write_toml"]
