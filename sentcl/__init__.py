"""sentcl: contrastive fine-tuning of sentence encoders. Pure logic: no DVC, Prefect, MLflow or GX here."""

__version__ = "0.1.0"
