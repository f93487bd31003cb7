"""Where the tests find the repository, wherever in tests/ a test module sits."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
