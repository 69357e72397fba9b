"""The installed wheel holds every package of the source tree (tests import from the checkout, so they cannot see a
package pyproject.toml leaves out of a plain ``pip install .``)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_installed():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "rawgraphs").rglob("__init__.py")}
    listed = set(setup["packages"])
    assert on_disk <= listed, f"pyproject.toml's packages leave out {sorted(on_disk - listed)}"
    assert setup["package-dir"]["rawgraphs._kernels"] == "kernels"
    assert listed - on_disk == {"rawgraphs._kernels"}, "a listed package has no source folder"
