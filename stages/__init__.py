"""One module per DVC stage (dvc.yaml names each: ``python -m stages.<name>``): read params.yaml, do the file I/O,
log, call sentcl. Beside them, what the stages share (``common``: paths and params; ``cli``: one line and an exit
code for an error; ``training``: the three training stages' run) and three commands that run the way a stage does
but are no DVC stage: ``embed`` (a file of sentences to vectors), ``analyze`` (the papers' analyses, ``make
analyses``) and ``profile`` (a params profile as a DVC experiment, ``make exp``)."""

import os

# Every entry point (`python -m stages.<name>`, and `python -m flows.<name>`, whose package imports this one)
# runs with the libraries' telemetry off, before any of them is imported: offline, a heartbeat only fails
# ("ERROR ... Failed to send telemetry" from Prefect's server), and nobody asked for one. MLflow reads
# DO_NOT_TRACK only as "true", hence its own switch. A value set by the user wins.
TELEMETRY_OFF = {
    "DO_NOT_TRACK": "1",  # Prefect client, huggingface_hub
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # the Prefect server's heartbeat (ephemeral or `prefect server`)
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "GX_ANALYTICS_ENABLED": "False",
    "DVC_NO_ANALYTICS": "1",
}
for _key, _value in TELEMETRY_OFF.items():
    os.environ.setdefault(_key, _value)
