"""Stage ``base``: the init model as a sentence-transformers folder, models/base, read like every checkpoint."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from sentcl.model.encoder import Encoder
from stages.common import MODELS, load_params, offline_hub


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", default=str(MODELS / "base"))
    parser.add_argument("--params", default=None, help="params file (default: params.yaml)")
    args = parser.parse_args(argv)
    offline_hub()
    params = load_params(Path(args.params) if args.params else None)
    encoder = Encoder.from_pretrained(params["model"]["name"], max_length=params["model"]["max_length"])
    shutil.rmtree(args.output, ignore_errors=True)
    encoder.save(args.output)
    print(f"base: {params['model']['name']} -> {args.output}")


if __name__ == "__main__":
    main()
