"""The trainer every aiptrain job of the benchmarks runs (benchmarks/harness.py copies this package
into its temporary directory): it prints a line, optionally --lines more, optionally a timed
tick every half second (--ticks), optionally sleeps, and ignores the --job-dir aiptrain appends."""

import argparse
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--lines", type=int, default=0)
parser.add_argument("--sleep", type=float, default=0.0)
parser.add_argument("--ticks", type=int, default=0)
args, _ = parser.parse_known_args()
print("hello from the benchmark trainer", flush=True)
for i in range(args.lines):
    sys.stdout.write(f"line {i:06d} of the log-streaming benchmark: 0123456789abcdef\n")
sys.stdout.flush()
for i in range(args.ticks):
    time.sleep(0.5)
    print(f"tick {i} {time.time():.6f}", flush=True)
if args.sleep:
    time.sleep(args.sleep)
