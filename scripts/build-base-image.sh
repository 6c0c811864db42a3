#!/usr/bin/env bash
# Build a base image the runtime images start FROM, offline-friendly: no registry is needed,
# only Debian's package mirror on the host. Does nothing when the image exists from this recipe.
#   usage: scripts/build-base-image.sh [SUITE [IMAGE]]
#   SUITE: bookworm (Python 3.11, the default) or bullseye (Python 3.9)
#   IMAGE: default ${AIPTRAIN_BASE_REPOSITORY:-aiptrain/base}:SUITE
#          (for bookworm, $AIPTRAIN_BASE_IMAGE when set)
set -euo pipefail

suite="${1:-bookworm}"
case "$suite" in
  bookworm) python=3.11 default="${AIPTRAIN_BASE_IMAGE:-}" ;;
  bullseye) python=3.9 default="" ;;
  *) echo "Unknown suite [$suite]: choose bookworm or bullseye." >&2; exit 2 ;;
esac
image="${2:-${default:-${AIPTRAIN_BASE_REPOSITORY:-aiptrain/base}:$suite}}"
# Bumped whenever what this script puts into a base changes: aiptrain rebuilds a base (and the
# runtimes on it) whose aiptrain.base-recipe label differs (aiptrain/runtimes.py reads this line).
recipe=2
built=$(docker image inspect -f '{{index .Config.Labels "aiptrain.base-recipe"}}' "$image" 2>/dev/null || true)
if [ "$built" = "$recipe" ]; then
  exit 0
fi
labels=(-c "LABEL aiptrain.base=debian-$suite aiptrain.python=$python aiptrain.base-recipe=$recipe")
# A registry may be reachable on some machines: a pull is faster than debootstrap.
# libgomp1: XGBoost before 1.6 links the system's OpenMP runtime (`import xgboost` fails without it).
if docker pull -q "python:$python-slim-$suite" >/dev/null 2>&1 && echo "FROM python:$python-slim-$suite
RUN apt-get update -qq && apt-get install -y -qq libgomp1 >/dev/null && rm -rf /var/lib/apt/lists/*
LABEL aiptrain.base=python:$python-slim-$suite aiptrain.python=$python aiptrain.base-recipe=$recipe" | docker build -q -t "$image" - >/dev/null; then
  exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  else
    echo "debootstrap is missing: install it (apt-get install debootstrap) or build $image yourself." >&2
    exit 3
  fi
fi
if [ "$(id -u)" != 0 ]; then
  echo "Building $image with debootstrap needs root." >&2
  exit 3
fi
rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
echo "Building base image $image (Debian $suite, Python $python) with debootstrap (about a minute) ..." >&2
debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,libgomp1 \
  "$suite" "$rootfs" http://deb.debian.org/debian >/dev/null
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import -c 'ENV LANG=C.UTF-8' "${labels[@]}" - "$image" >/dev/null
echo "Built $image" >&2
