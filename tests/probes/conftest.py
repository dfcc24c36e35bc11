"""Fixtures the probe tests share, imported here so that pytest finds them by name and no test
module shadows an imported name with a parameter."""
from tests.support.llm import sim  # noqa: F401 - a fixture: pytest finds it by name
