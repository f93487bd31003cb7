-- One Postgres, three databases: Prefect's, MLflow's and MLflow's users (the default one, sentcl, stays empty).
CREATE DATABASE prefect OWNER sentcl;
CREATE DATABASE mlflow OWNER sentcl;
CREATE DATABASE mlflow_users OWNER sentcl;  -- MLflow's basic-auth app: users and permissions
