"""Experiment files: each declares a DAG of steps and ends with `executor_main(...)`."""
