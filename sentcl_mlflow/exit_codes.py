"""The exit codes every stage and flow ends with: the only two a person or a flow acts on.

A flow retries a stage only on EXIT_TRANSIENT (BSD's EX_TEMPFAIL: "try again later": a tracking server or lock
that did not answer); never on a word in the output. Which error gets which code is the table in
``sentcl_mlflow.errors``; this file imports nothing, so a stage that never talks to MLflow (fetch, validate)
depends on these two numbers only.
"""

import os

EXIT_BAD_INPUT = 2  # a person must act: bad input, refused credentials or permissions
EXIT_TRANSIENT = os.EX_TEMPFAIL  # 75: try again later
