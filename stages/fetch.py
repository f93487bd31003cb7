"""DVC stage `fetch`: SentEval STS12-16, STS-B, SICK and SNLI into data/raw, with a manifest.

Sources, first that exists wins: $SENTEVAL_MIRROR, `data.mirror` in params.yaml (a folder or an http(s)/file URL
of a tarball in SentEval layout), the team mirror ../shared/senteval beside the checkout, then the public upstream
(the SentEval tarball the SimCSE authors publish for STS and SICK, and the SNLI release for SNLI dev/test).
DVC does not see the environment variable: after switching sources run `dvc repro -f fetch`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sentcl.data.fetching import FetchConfig, FetchError, source_record
from sentcl.data.fetching import fetch as fetch_into
from stages.common import RAW, SHARED_MIRROR, load_params


def fetch(config: FetchConfig, output: Path = RAW) -> dict:
    """``sentcl.data.fetching.fetch`` with this checkout's team mirror; returns the manifest."""
    return fetch_into(config, output, SHARED_MIRROR)


def main() -> None:
    params = load_params()
    try:
        config = FetchConfig.from_params(params)
    except ValueError as exc:
        print(params.relabel(str(exc)), file=sys.stderr)
        sys.exit(2)
    try:
        manifest = fetch(config)
    except FetchError as exc:
        print(f"fetch: {exc}", file=sys.stderr)
        sys.exit(2)
    print(
        f"fetch: {len(manifest['files'])} files from {manifest['source']} ({manifest['source_setting']}) -> {RAW}"
        f" (source recorded in {source_record(RAW).relative_to(RAW.parent.parent)})"
    )


if __name__ == "__main__":
    main()
