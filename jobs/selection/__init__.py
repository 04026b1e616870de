"""Chain sampling and selection: k sampled chains plus a greedy one per question from a language model
(`python -m jobs.selection.sample_chains`, JSONL for ingest) and the choice of one chain per question among them
(`python -m jobs.selection.select_chains`, over `chains` and `chain_scores`) by the selection methods of
udfs/selection.py, their parameters cross-validated over questions (cross_validation.py)."""
