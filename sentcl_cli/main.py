"""The sentcl command: the pipeline, embedding, retraining, the gate and the local servers.

Each command hands its options to the entry point it names, whose parser reads them (``sentcl embed --help``
is ``python -m stages.embed --help``); the ``python -m`` forms stay. Nothing is imported until a command is
chosen, so ``sentcl --help`` is quick and reads no params.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What the Makefile exports for everything it starts (see its header), for the same commands run as `sentcl`.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass(frozen=True)
class Command:
    summary: str
    target: str  # "module:function" called with the remaining argv, or "infra/<script>.sh"


COMMANDS = {
    "run": Command(
        "the whole pipeline, what is out of date (dvc repro; its options)", "sentcl_cli.main:repro"
    ),
    "pipeline": Command(
        "the same as one Prefect flow, a task per stage (flows.pipeline)", "flows.pipeline:main"
    ),
    "embed": Command("a file of sentences to vectors, with the champion or any model", "stages.embed:main"),
    "evaluate": Command(
        "score model folders on the seven STS tasks (stages.evaluate)", "stages.evaluate:main"
    ),
    "export": Command("the best checkpoint as a release folder (registers nothing)", "stages.export:main"),
    "register": Command(
        "a release folder as a challenger version, then the gate (stages.register)", "stages.register:main"
    ),
    "retrain": Command("retrain the champion on new domain text; the gate decides", "flows.retrain:main"),
    "promote": Command("gate the challenger (or --version N) against the champion", "flows.promote:main"),
    "rollback": Command("give champion back to the previous champion", "flows.promote:rollback_main"),
    "serve": Command("local Prefect + MLflow servers with scheduled retrains (make serve)", "infra/serve.sh"),
    "stop": Command("stop what serve started (make stop)", "infra/stop.sh"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {command.summary}" for name, command in COMMANDS.items()]
    return (
        "usage: sentcl <command> [options]    (sentcl <command> --help: its options)\n\n"
        + (__doc__ or "").split("\n")[0]
        + "\n\ncommands:\n"
        + "\n".join(lines)
        + "\n"
    )


def environment() -> None:
    """As `make` runs a command: this environment's bin first on PATH (the `python` and `dvc` of dvc.yaml's
    commands and of every stage a flow starts), the Hugging Face hub offline unless the user said otherwise."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + path
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    import stages  # noqa: F401 (telemetry off, as for every entry point)


def repro(argv: Sequence[str]) -> int:
    """``dvc repro`` with these arguments, from the checkout (what `make run` runs)."""
    from dvc.cli import main as dvc_main

    os.chdir(ROOT)
    return dvc_main(["repro", *argv])


def script(path: str, argv: Sequence[str], name: str) -> int:
    """``infra/serve.sh`` or ``infra/stop.sh`` of this checkout, with their options as its variables."""
    from stages.common import argument_parser, fail

    file = ROOT / path
    parser = argument_parser(COMMANDS[name].summary, prog=f"sentcl {name}")
    if name == "serve":
        parser.add_argument("--prefect-port", type=int, help="the Prefect server's port (default 4200)")
        parser.add_argument("--mlflow-port", type=int, help="the MLflow server's port (default 5000)")
    args = parser.parse_args(argv)
    if not file.is_file():
        fail(f"sentcl {name}: {file} is not there: {name} runs from a checkout of sentcl (pip install -e .)")
    env = {**os.environ, "VENV": sys.prefix}
    for option, key in (("prefect_port", "PREFECT_PORT"), ("mlflow_port", "MLFLOW_PORT")):
        if getattr(args, option, None) is not None:
            env[key] = str(getattr(args, option))
    return subprocess.call(["bash", str(file)], cwd=ROOT, env=env)


def entry(target: str) -> Callable[[list[str]], int | None]:
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    command = COMMANDS.get(name)
    if command is None:
        print(f"sentcl: no command {name!r} (one of: {', '.join(COMMANDS)}; sentcl --help)", file=sys.stderr)
        return 2
    environment()
    if command.target.endswith(".sh"):
        return script(command.target, rest, name)
    sys.argv = [f"sentcl {name}", *rest]  # the entry point's parser names itself `sentcl <name>`
    try:
        code = entry(command.target)(rest)
    except SystemExit as done:  # argparse's --help and refusals, a stage's one-line exit
        code = done.code
    if isinstance(code, str):  # sys.exit("message"), as Python itself would say it
        print(code, file=sys.stderr)
    return code if isinstance(code, int) else (0 if code is None else 1)


if __name__ == "__main__":
    sys.exit(main())
