"""ReCEval scoring: ingest -> steps (RCUs) -> NLI and PVI step scores -> chain aggregates -> curation, run
together by the nightly `pipeline`; also the PVI model training, chain selection, the nightly report and the
export of curated chains (`python -m jobs.receval.export`)."""
