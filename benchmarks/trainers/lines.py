"""The benchmark trainer's `--lines N` output from a bare container (figure 5's baselines): run as
`python3 -c "$(cat lines.py)" N` inside the image, so that nothing is mounted or installed."""

import sys

print('hello from the benchmark trainer', flush=True)
for i in range(int(sys.argv[1])):
    sys.stdout.write(f'line {i:06d} of the log-streaming benchmark: 0123456789abcdef\n')
sys.stdout.flush()
