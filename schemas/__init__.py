"""Data contracts: one module per Delta table, each with its StructType and column names."""
