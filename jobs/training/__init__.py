"""Model training: the NLI cross-encoder (`python -m jobs.training.train_nli`, models/nli-small) and the PVI
models g, g' and the seq2seq information-gain model (`python -m jobs.training.train_pvi`, models/pvi-small/<kind>)
that the `small` profile scores with. Training reads public datasets (jobs.infra.data), never the lake; its
prompts are the scoring job's own (udfs.pvi_prompts), and it reads EntailmentBank trees with
jobs.metaeval.entailment_bank."""
