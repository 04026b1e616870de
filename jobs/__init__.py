"""Spark jobs, by concern: `receval` (scoring stages and the nightly pipeline), `metaeval` (error labels and
Somers' D), `cot` (CoT Collection evaluation) and `infra` (config, Spark session, Delta tables, MLflow, setup)."""
