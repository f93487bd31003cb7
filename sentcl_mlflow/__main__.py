"""`python -m sentcl_mlflow` prints where runs go."""

from sentcl_mlflow.store import tracking_uri

print(tracking_uri())
