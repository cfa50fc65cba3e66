"""Where splitlab's shipped files are: the kernel cards, the notebooks and the result sets, in a checkout or in an
installed package.

One copy of each lives in the repository, at its top (``kernels/*.toml``, ``notebooks/*.py``); a built wheel carries
them inside the package as ``splitlab/_cards`` and ``splitlab/_notebooks`` (``pyproject.toml``'s ``package-dir``
maps the two folders there; ``tests/test_install.py`` installs the wheel and runs from outside the checkout). In a
checkout, editable install or not, the package has no such folders and the repository's are read. The constants
files are package data of ``splitlab.planners`` (``planners.fitted.SHIPPED_DIR``). Of the shipped result sets
(``data/``), a wheel carries those the default report reads as ``splitlab/_data``: ``catalog.toml`` and the
current, confirm and peers sets' sweeps (``results.parquet`` and ``sweep.json`` each; ``pyproject.toml``'s
package-data names them), so that ``splitlab report`` shows the shipped headline anywhere; the other sets (studies,
archive) stay in the repository.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
#: The repository the package sits in, when it runs from a checkout.
CHECKOUT = PACKAGE.parent
#: Folder names: in the repository, and inside an installed package (``pyproject.toml``'s ``package-dir``).
CARDS, PACKAGED_CARDS = "kernels", "_cards"
NOTEBOOKS, PACKAGED_NOTEBOOKS = "notebooks", "_notebooks"
DATA, PACKAGED_DATA = "data", "_data"


def _shipped(packaged: str, repository: str) -> Path:
    inside = PACKAGE / packaged
    return inside if inside.is_dir() else CHECKOUT / repository


def cards_dir() -> Path:
    """The shipped kernel cards' folder."""
    return _shipped(PACKAGED_CARDS, CARDS)


def notebooks_dir() -> Path:
    """The shipped notebooks' folder."""
    return _shipped(PACKAGED_NOTEBOOKS, NOTEBOOKS)


def data_dir() -> Path:
    """The shipped result sets' folder, with their catalog (``catalog.toml``): the repository's ``data/``, or the
    sets a wheel carries."""
    return _shipped(PACKAGED_DATA, DATA)
