"""The harness's test fixtures (tests/conftest.py) for the research probes' own tests:
`python -m pytest research` (not part of `make test`)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "harness_fixtures", Path(__file__).parents[1] / "tests" / "conftest.py"
)
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
globals().update({k: v for k, v in vars(_fixtures).items() if not k.startswith("_")})


def pytest_collection_modifyitems(items):
    """Every test under research/ carries the `research` marker: kept out of `make test`."""
    import pytest

    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.research)
