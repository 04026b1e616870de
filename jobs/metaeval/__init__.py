"""Meta-evaluation: error-labelled chains (perturbed EntailmentBank, ROSCOE GSM-8K human labels, ProcessBench's
step labels), ROSCOE-style baseline metrics, Somers' D between every metric and every error label, and step-level
error localisation. The EntailmentBank and ProcessBench adapters (`entailment_bank`, `processbench_items`,
`step_labels`), `negation`, Somers' D (`somers`) and the localisation maths (`localise_maths`) run on the driver
and live here; jobs.training.train_pvi reads EntailmentBank trees with `entailment_bank` too."""
