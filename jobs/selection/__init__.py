"""Chain sampling and selection: k sampled chains plus a greedy one per question from a language model
(`python -m jobs.selection.sample_chains`, JSONL for ingest) and ReCEval-guided choice of one chain per question
among them (`python -m jobs.selection.select_chains`, over `chains` and `chain_scores`)."""
