"""Stage ``joint``: NLI cross-entropy + alpha * NT-Xent over two views of the NLI sentences -> models/joint."""

from __future__ import annotations

from stages.pretrain_nli import main as _main


def main(argv: list[str] | None = None) -> None:
    _main(argv, section="joint", stage="joint", mode="joint")


if __name__ == "__main__":
    from sentcl_mlflow.errors import run_main  # MLflow died or hung mid-stage: one line, exit 75

    raise SystemExit(run_main("joint", main))
