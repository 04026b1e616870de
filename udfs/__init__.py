"""Model maths and text processing that Spark tasks run (pandas UDFs, mapInPandas / applyInPandas functions) and
what they import; testable without Spark. Also where the code runs from (`home`: a checkout or an installed wheel,
and the folder relative paths resolve against). Code that runs only on the driver (dataset adapters, statistics
over collected rows) lives in the room that uses it: tests/test_layout.py checks that every module here is imported
by code that ships work to Spark tasks."""
