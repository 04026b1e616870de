"""Meta-evaluation: error-labelled chains (perturbed EntailmentBank, ROSCOE GSM-8K human labels, ProcessBench's
step labels), ROSCOE-style baseline metrics, Somers' D between every metric and every error label, and step-level
error localisation."""
