-- One Postgres, two databases: Prefect's and MLflow's (the default one, sentcl, stays empty).
CREATE DATABASE prefect OWNER sentcl;
CREATE DATABASE mlflow OWNER sentcl;
