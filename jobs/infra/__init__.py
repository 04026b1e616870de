"""What every job stands on: layered config, the Spark session with Delta, Delta table helpers, MLflow
tracking (with dataset lineage, `lineage`, and MLflow models, `mlflow_models`), logs and progress, lake
upkeep (`python -m jobs.infra.maintain`), the Delta jar cache (`python -m jobs.infra.jars`) and the tiny
offline models (`python -m jobs.infra.tiny_models`), and the `receval` command that runs every stage and tool
(`cli`, the installed package's console script)."""
