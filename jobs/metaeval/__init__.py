"""Meta-evaluation: error-labelled chains (perturbed EntailmentBank, ROSCOE GSM-8K human labels), ROSCOE-style
baseline metrics, and Somers' D between every metric and every error label."""
