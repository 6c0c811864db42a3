#!/usr/bin/env bash
# The store tests (tests/unit/test_store.py and the others over `store_location`) start a PostgreSQL
# server of their own from Debian's postgresql binaries (initdb, pg_ctl). Install them when
# missing (as root, on Debian); elsewhere report what to install. The package's own cluster
# service is left as apt sets it up: the tests never use it.
set -euo pipefail

if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "The store tests need PostgreSQL's server programs: apt-get install postgresql (as root)." >&2
  exit 3
fi
echo "Installing Debian's postgresql ..." >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
