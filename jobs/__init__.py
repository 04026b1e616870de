"""Spark jobs: one module per stage, each a pure transform plus a thin main."""
