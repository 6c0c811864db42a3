#!/usr/bin/env bash
# Make sure a Docker engine answers. On a bare Debian machine (as root) install Debian's
# docker.io and start dockerd in the background; elsewhere just report what is missing.
# A dockerd started here leaves its PID in $AIPTRAIN_DOCKERD_MARKER: the test suite restarts
# only an engine it finds there (never one that others use).
set -euo pipefail
MARKER="${AIPTRAIN_DOCKERD_MARKER:-/run/aiptrain-dockerd.pid}"

if docker info >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "No Docker engine answers and this is not root: start Docker (or add yourself to the docker group)." >&2
  exit 3
fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "Installing Debian's docker.io ..." >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
# An engine that runs but is slow to answer (a loaded machine, or one still starting) is waited
# for, never started twice.
if pgrep -x dockerd >/dev/null 2>&1; then
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && exit 0
    sleep 0.5
  done
  echo "dockerd is running but does not answer; see /var/log/aiptrain-dockerd.log" >&2
  exit 3
fi
# A dockerd killed with its session leaves its pid file behind; a reused PID would block the start.
rm -f /var/run/docker.pid
echo "Starting dockerd in the background (log: /var/log/aiptrain-dockerd.log) ..." >&2
# A session of its own: a dockerd started by a test (or a shell job) does not die with its caller's
# process group. Not a process group leader here, so setsid runs dockerd itself and $! is its PID.
setsid nohup dockerd >/var/log/aiptrain-dockerd.log 2>&1 &
echo $! >"$MARKER"
for _ in $(seq 1 60); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 0.5
done
echo "dockerd did not come up; see /var/log/aiptrain-dockerd.log" >&2
tail -20 /var/log/aiptrain-dockerd.log >&2 || true
exit 3
