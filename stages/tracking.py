"""`python -m stages.tracking`: print where runs go (the MLflow tracking URI in use). The MLflow layer itself is
``sentcl_mlflow``."""

from sentcl_mlflow.store import tracking_uri

if __name__ == "__main__":
    print(tracking_uri())
