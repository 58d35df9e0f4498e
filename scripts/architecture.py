"""Print docs/design.md's table of layers from mtlab/_layers.py and the folders (``--check`` compares)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mtlab._layers import LAYERS  # noqa: E402


def table() -> str:
    lines = ["| layer | folders | what |", "|---|---|---|"]
    for name, folders, what in LAYERS:
        lines.append(f"| {name} | {', '.join(f'`{f}/`' for f in folders)} | {what} |")
    return "\n".join(lines)


if __name__ == "__main__":
    text = table()
    if "--check" in sys.argv:
        design = (ROOT / "docs" / "design.md").read_text()
        sys.exit(0 if text in design else "docs/design.md's table of layers is out of date: "
                 "run scripts/architecture.py and paste it there")
    print(text)
