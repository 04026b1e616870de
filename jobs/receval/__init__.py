"""ReCEval scoring: ingest -> steps (RCUs) -> NLI and PVI step scores -> chain aggregates -> curation, run
together by the nightly `pipeline`; also the nightly report and the export of curated chains
(`python -m jobs.receval.export`), and scoring from code (`api`: a DataFrame of chains -> scores, the night on a
lake path). Model training is in jobs.training, chain sampling and selection in
jobs.selection."""
