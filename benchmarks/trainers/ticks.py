"""A line with the time it was written, every half second, N of them (figure 5d's live
container): run as `python3 -c "$(cat ticks.py)" N` inside the image."""

import sys
import time

for i in range(int(sys.argv[1])):
    time.sleep(0.5)
    print(f'tick {i} {time.time():.6f}', flush=True)
