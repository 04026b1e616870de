"""Model-backed and text-processing functions for pandas UDFs; testable without Spark."""
