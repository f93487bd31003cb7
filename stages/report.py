"""One self-contained HTML page from metrics/ and plots/: reports/index.html (images embedded).

    python -m stages.report [--output FILE]

Sections appear for what exists: the STS table (metrics/sts.json), training curves (metrics/curves/*.csv),
the collapse plot and every analysis that has been run (metrics/analysis/, plots/). The page is
:func:`sentcl.report.render_report` with the template ``sentcl/templates/report.html.j2``.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sentcl.report import render_report
from stages.common import METRICS, PLOTS, REPORTS, ROOT, load_params, params_arguments


def render(metrics: Path, plots: Path, params: Mapping[str, Any]) -> str:
    """The page for this checkout: its commit and ``params``."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout
    return render_report(metrics, plots, params, commit.strip(), ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, default=REPORTS / "index.html")
    params_arguments(parser)
    args = parser.parse_args(argv)
    params = load_params(args.params, args.overrides)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render(METRICS, PLOTS, params))
    print(f"report: {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
