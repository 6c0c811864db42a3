#!/usr/bin/env bash
# Build the base image the runtime images start FROM, offline-friendly: no registry is needed,
# only Debian's package mirror on the host. Does nothing when the image already exists.
#   usage: scripts/build-base-image.sh [IMAGE]   (default: $AIPTRAIN_BASE_IMAGE or aiptrain/base:bookworm)
set -euo pipefail

image="${1:-${AIPTRAIN_BASE_IMAGE:-aiptrain/base:bookworm}}"
if docker image inspect "$image" >/dev/null 2>&1; then
  exit 0
fi
# A registry may be reachable on some machines: a pull is faster than debootstrap.
if docker pull -q python:3.11-slim-bookworm >/dev/null 2>&1; then
  docker tag python:3.11-slim-bookworm "$image"
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
echo "Building base image $image with debootstrap (about a minute) ..." >&2
debootstrap --variant=minbase --include=python3,python3-pip,python3-venv \
  bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | docker import -c 'ENV LANG=C.UTF-8' - "$image" >/dev/null
echo "Built $image" >&2
