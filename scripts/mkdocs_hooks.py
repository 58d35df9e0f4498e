"""MkDocs hook: the API pages are generated from the package's public names, so a new public name gets
its entry (and a missing docstring shows) without anyone editing the pages.

A page writes one of these markers on a line of its own:

- ``<!-- api-names: mtlab.data -->``: every name in ``mtlab.data.__all__``, each documented where it is
  defined, under an anchor with its public name (``#mtlab.data.load_split``);
- ``<!-- api-modules: mtlab.core -->``: every module of that package (or that one module), with its public
  members, leaving out the objects an ``api-names`` marker already documents (one entry per object).

The site loads nothing from another host (a class behind a firewall, a laptop offline): the theme's fonts are off
(``theme.font: false`` in mkdocs.yml) and a tutorial page loses the loader nbconvert writes for Mermaid diagrams
(an import from cdnjs.cloudflare.com), which no tutorial uses (``on_post_page``).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType
from typing import Any

NAMES = re.compile(r"^<!-- api-names: ([\w.]+) -->$", re.M)
MODULES = re.compile(r"^<!-- api-modules: ([\w.]+) -->$", re.M)
# nbconvert's Mermaid loader on every notebook page: a module script that imports mermaid from a CDN.
MERMAID_DIAGRAM = re.compile(r'class="[^"]*\bjp-Mermaid\b')  # an element, not the loader's selector or the CSS
MERMAID_LOADER = re.compile(r'<script type="module">(?:(?!</script>).)*?/mermaid(?:(?!</script>).)*?</script>', re.S)
# Packages whose __all__ the API pages list by public name (the other modules are documented module by module).
NAMED_PACKAGES = ("mtlab", "mtlab.models", "mtlab.data", "mtlab.separation", "mtlab.ui", "mtlab.nabu")


def _real_path(package: ModuleType, name: str) -> str | None:
    """Where ``package.name`` is defined (``mtlab.core.trainer.Trainer``); None for a module or a value."""
    obj: Any = getattr(package, name)
    if inspect.ismodule(obj):
        return None
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname and module.startswith("mtlab"):
        return f"{module}.{qualname}"
    return None


def _documented() -> set[str]:
    """The definition paths the ``api-names`` pages document."""
    out: set[str] = set()
    for pkg in NAMED_PACKAGES:
        package = importlib.import_module(pkg)
        out.update(p for n in package.__all__ if (p := _real_path(package, n)))
    return out


def _names(pkg: str) -> str:
    package = importlib.import_module(pkg)
    blocks = []
    for name in package.__all__:
        public = f"{pkg}.{name}"
        obj = getattr(package, name)
        if inspect.ismodule(obj):
            page = obj.__name__.split(".")[1] if obj.__name__.count(".") >= 1 else ""
            blocks.append(f"## `{public}` {{#{public}}}\n\n{_first_line(obj)} See [{obj.__name__}]({page}.md).\n")
            continue
        real = _real_path(package, name) or public
        blocks.append(f"[](){{#{public}}}\n\n::: {real}\n    options:\n      heading: \"{public}\"\n"
                      f"      toc_label: \"{name}\"\n")
    return "\n".join(blocks)


def _first_line(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.split("\n\n")[0].replace("\n", " ")


def _modules(pkg: str) -> str:
    package = importlib.import_module(pkg)
    names = [pkg]
    if hasattr(package, "__path__"):
        names += sorted(m.name for m in pkgutil.iter_modules(package.__path__, pkg + ".")
                        if not m.name.rsplit(".", 1)[1].startswith("_") and m.name != "mtlab.__main__")
    done = _documented()
    blocks = []
    for modname in names:
        module = importlib.import_module(modname)
        own = [n for n, v in vars(module).items() if not n.startswith("_") and getattr(v, "__module__", None) == modname
               and (inspect.isclass(v) or inspect.isfunction(v))]
        skip = [n for n in own if f"{modname}.{n}" in done]
        filters = ", ".join(['"!^_"'] + [f'"!^{n}$"' for n in skip])
        elsewhere = "".join(f"\n`{n}` is documented as [`{_public(f'{modname}.{n}')}`]"
                            f"({_page_of(_public(f'{modname}.{n}'))}#{_public(f'{modname}.{n}')}).\n"
                            for n in skip)
        members = "      members: false\n" if hasattr(module, "__all__") and hasattr(module, "__path__") else ""
        blocks.append(f"::: {modname}\n    options:\n      filters: [{filters}]\n      show_submodules: false\n"
                      f"{members}{elsewhere}")
    return "\n".join(blocks)


def _public(real: str) -> str:
    for pkg in NAMED_PACKAGES:
        package = importlib.import_module(pkg)
        for n in package.__all__:
            if _real_path(package, n) == real:
                return f"{pkg}.{n}"
    return real


def _page_of(public: str) -> str:
    parts = public.split(".")
    return "mtlab.md" if len(parts) == 2 else f"{parts[1]}.md"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = NAMES.sub(lambda m: _names(m.group(1)), markdown)
    return MODULES.sub(lambda m: _modules(m.group(1)), markdown)


def on_post_page(output: str, page: Any, config: Any) -> str:
    """A notebook page without Mermaid diagrams loses nbconvert's loader of mermaid from a CDN; a page with one
    keeps it (tests/docs/test_docs.py then names the page: ship mermaid with the site first)."""
    if MERMAID_DIAGRAM.search(output):
        return output
    return MERMAID_LOADER.sub("", output)
