"""The built-in algorithms' trainers, as they run inside their images (gcr.io/cloud-ml-algos/...).

Copied into each algorithm's image as the package `aiptrain_algorithms` (aiptrain/algorithms/
images.py) and run as `python3 -m aiptrain_algorithms` with the algorithm's flags: the service's
contract (flags, preprocessing, the files in --job-dir, the metrics reported for tuning) in
docs/guide/built-in-algorithms.md.

Runs on the image's Python (3.9), beside nothing of aiptrain: its modules import one another
relatively and nothing else of aiptrain. The pure parts (flags, columns, preprocess, outputs) use
the standard library only, so the host's tests run them; TensorFlow and XGBoost are imported by
the trainers that need them, once the flags are checked (a bad flag fails in a second).
"""
