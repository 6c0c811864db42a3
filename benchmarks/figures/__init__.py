"""One module per group of figures; benchmarks/run.py lists them in the order they run."""
