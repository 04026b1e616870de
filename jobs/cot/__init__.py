"""CoT Collection evaluation: `data` loads BBH, P3 held-out (promptsource templates) and MGSM examples;
`evaluate` runs Direct and chain-of-thought accuracy for encoder-decoder and decoder-only models."""
