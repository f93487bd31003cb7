"""`python -m stages.tracking`: print where runs go (the MLflow tracking URI in use).

The MLflow layer itself is ``sentcl_mlflow``; the names re-exported here keep older imports
(``from stages import tracking``) working until every caller imports ``sentcl_mlflow`` directly.
"""

from sentcl_mlflow.registry import *  # noqa: F403
from sentcl_mlflow.registry import CHAMPION, download_alias, download_model  # noqa: F401
from sentcl_mlflow.runs import *  # noqa: F403
from sentcl_mlflow.runs import log_stage, preflight  # noqa: F401
from sentcl_mlflow.store import *  # noqa: F403
from sentcl_mlflow.store import tracking_uri

if __name__ == "__main__":
    print(tracking_uri())
