"""Model-backed and text-processing functions for pandas UDFs; testable without Spark. Also where the code runs
from (`home`: a checkout or an installed wheel, and the folder relative paths resolve against)."""
