"""Stage ``base``: the init model as a sentence-transformers folder, models/base, read like every checkpoint."""

from __future__ import annotations

import argparse
import shutil

from sentcl.model.encoder import Encoder
from stages.common import MODELS, load_params, offline_hub, params_arguments


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", default=str(MODELS / "base"))
    params_arguments(parser)
    args = parser.parse_args(argv)
    offline_hub()
    params = load_params(args.params, args.overrides)
    encoder = Encoder.from_pretrained(params["model"]["name"], max_length=params["model"]["max_length"])
    shutil.rmtree(args.output, ignore_errors=True)
    encoder.save(args.output)
    print(f"base: {params['model']['name']} -> {args.output}")


if __name__ == "__main__":
    main()
