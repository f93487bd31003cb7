"""Where the tests find the repository, wherever in tests/ a test module sits: the project's one ``ROOT``."""

from sentcl.params import ROOT

__all__ = ["ROOT"]
