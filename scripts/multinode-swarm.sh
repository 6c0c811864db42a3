#!/usr/bin/env bash
# A two-node Docker Swarm on one machine, for `make test-multinode`:
#
#   scripts/multinode-swarm.sh up       start it (idempotent)
#   scripts/multinode-swarm.sh status   say what is there; exit 0 when both nodes are Ready
#   scripts/multinode-swarm.sh down     remove only what `up` created (idempotent)
#   scripts/multinode-swarm.sh purge    `down`, then delete node2's data-root (its image cache)
#
# `up` starts a second dockerd in its own network namespace (aiptrain-node2, its own UTS
# namespace so that its node is named aiptrain-node2), reached over a veth pair (host 10.99.0.1,
# node2 10.99.0.2), and joins it as a worker to the host engine's swarm. When the host engine is
# not in a swarm, `up` initialises one on the host's default-route address and leaves a marker:
# only then does `down` leave that swarm. A swarm that was already there (another test's, a
# developer's) is joined and never left. The images named in MULTINODE_IMAGES are copied into
# node2 (no registry here), skipped when node2 already has the same image ID. Nodes get the
# label aiptrain-node=1 (host) and aiptrain-node=2.
#
# Measured facts behind this: ../shared/reference/runtime-notes.md ("A two-node Docker Swarm on
# one machine"); `ip netns exec` cannot be used (it remounts /sys and dockerd stops with
# "Devices cgroup isn't mounted"), `nsenter --net` keeps the host's mounts. Run as root.
set -euo pipefail

NS=aiptrain-node2
NODE2_HOSTNAME=aiptrain-node2
VETH_HOST=aiptrain-n2h          # interface names: at most 15 characters
VETH_NODE=aiptrain-n2n
HOST_VETH_ADDR=10.99.0.1
NODE_VETH_ADDR=10.99.0.2
DATA_ROOT=/var/lib/aiptrain-node2
EXEC_ROOT=/run/aiptrain-node2
STATE_DIR=/run/aiptrain-multinode
PIDFILE=$STATE_DIR/dockerd.pid
SWARM_MARKER=$STATE_DIR/swarm-created-by-up
NODE2_SOCK=unix:///run/aiptrain-node2.sock
LOG=/var/log/aiptrain-node2-dockerd.log
IMAGES=${MULTINODE_IMAGES:-aiptrain/runtime:minimal}

node2() { docker -H "$NODE2_SOCK" "$@"; }
say() { echo "multinode: $*" >&2; }
die() { echo "multinode: $*" >&2; exit "${2:-3}"; }

dockerd_running() {
  [ -s "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

swarm_state() {  # inactive | pending | active | locked | error, for the engine given by $@
  "$@" info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null || echo unreachable
}

default_route_address() {
  local dev
  dev=$(ip -4 route show default | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i + 1); exit}}')
  [ -n "$dev" ] || die "the host has no IPv4 default route: cannot choose a swarm address"
  ip -4 -o addr show dev "$dev" | awk '{split($4, a, "/"); print a[1]; exit}'
}

# --- up ------------------------------------------------------------------------------------

make_namespace() {
  [ -e "/var/run/netns/$NS" ] || ip netns add "$NS"
  if ! ip link show "$VETH_HOST" >/dev/null 2>&1; then
    ip link add "$VETH_HOST" type veth peer name "$VETH_NODE"
    ip link set "$VETH_NODE" netns "$NS"
  fi
  ip addr replace "$HOST_VETH_ADDR/24" dev "$VETH_HOST"
  ip link set "$VETH_HOST" up
  ip -n "$NS" addr replace "$NODE_VETH_ADDR/24" dev "$VETH_NODE"
  ip -n "$NS" link set "$VETH_NODE" up
  ip -n "$NS" link set lo up
  # Everything leaves through the host end: the host's own addresses (the swarm manager's
  # default-route address among them) are delivered locally there, so no NAT is needed.
  ip -n "$NS" route replace default via "$HOST_VETH_ADDR"
}

start_dockerd() {
  mkdir -p "$STATE_DIR" "$DATA_ROOT"
  if ! dockerd_running; then
    rm -f "$PIDFILE"
    say "starting node2's dockerd (log: $LOG)"
    # A UTS namespace of its own gives the node its own hostname in the swarm; a containerd
    # namespace of its own keeps it apart should both engines ever share one containerd.
    # No registry here: without DOCKER_SERVICE_PREFER_OFFLINE_IMAGE node2 tries to pull every
    # task's image first and waits out a DNS timeout before using its own copy.
    DOCKER_SERVICE_PREFER_OFFLINE_IMAGE=1 nohup nsenter --net="/var/run/netns/$NS" unshare --uts sh -c \
      "hostname $NODE2_HOSTNAME && exec dockerd --data-root $DATA_ROOT --exec-root $EXEC_ROOT \
         --pidfile $PIDFILE -H $NODE2_SOCK --bip 172.31.250.1/24 \
         --containerd-namespace aiptrain-node2 --containerd-plugins-namespace aiptrain-node2-plugins" \
      >>"$LOG" 2>&1 &
  fi
  for _ in $(seq 1 120); do
    node2 info >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  tail -20 "$LOG" >&2 || true
  die "node2's dockerd did not answer on $NODE2_SOCK within 60 s; see $LOG"
}

# Prints the manager address node2 joins.
ensure_host_swarm() {
  local state address
  state=$(swarm_state docker)
  case "$state" in
    inactive)
      address=$(default_route_address)
      say "initialising a swarm on the host engine ($address); \`down\` will leave it"
      docker swarm init --advertise-addr "$address" >/dev/null
      touch "$SWARM_MARKER"
      ;;
    active)
      [ "$(docker info --format '{{.Swarm.ControlAvailable}}')" = true ] \
        || die "the host engine is a swarm worker, not a manager: node2 cannot join through it"
      ;;
    *) die "the host engine's swarm is $state; fix or leave it first" ;;
  esac
  docker info --format '{{.Swarm.NodeAddr}}'
}

# The host must send node2 its VXLAN packets from the address the swarm knows it by: node2's
# overlay holds static entries for the host's containers at that address, and Linux drops VXLAN
# packets whose source differs from a static entry ("don't migrate static entries"). Without
# this route they leave from 10.99.0.1 and no overlay traffic gets through.
route_from_manager_address() {
  ip route replace "$NODE_VETH_ADDR/32" dev "$VETH_HOST" src "$1"
}

join_node2() {
  local manager=$1 state token
  state=$(swarm_state node2)
  if [ "$state" = active ]; then
    # Still a member of the host's swarm? Otherwise (the host left it and made a new one) rejoin.
    if docker node inspect "$(node2 info --format '{{.Swarm.NodeID}}')" >/dev/null 2>&1; then
      return 0
    fi
    say "node2 belongs to a swarm the host engine no longer manages; leaving it"
    node2 swarm leave --force >/dev/null
  fi
  # The manager must be reachable from the namespace (via 10.99.0.1).
  nsenter --net="/var/run/netns/$NS" bash -c "exec 3<>/dev/tcp/$manager/2377" 2>/dev/null \
    || die "node2 cannot reach the swarm manager at $manager:2377 from its namespace"
  token=$(docker swarm join-token -q worker)
  node2 swarm join --token "$token" --advertise-addr "$NODE_VETH_ADDR" "$manager:2377" >/dev/null
}

node2_id() { node2 info --format '{{.Swarm.NodeID}}'; }

wait_ready_and_label() {
  local id
  id=$(node2_id)
  for _ in $(seq 1 60); do
    [ "$(docker node inspect "$id" --format '{{.Status.State}}' 2>/dev/null)" = ready ] && break
    sleep 0.5
  done
  [ "$(docker node inspect "$id" --format '{{.Status.State}}')" = ready ] \
    || die "node2 joined the swarm but is not Ready after 30 s"
  docker node update --label-add aiptrain-node=2 "$id" >/dev/null
  docker node update --label-add aiptrain-node=1 "$(docker info --format '{{.Swarm.NodeID}}')" >/dev/null
}

load_images() {
  local image id
  for image in $IMAGES; do
    id=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null) \
      || die "image $image is not on the host engine (make images)"
    if [ "$(node2 image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)" = "$id" ]; then
      continue
    fi
    say "copying $image to node2"
    docker save "$image" | node2 load >/dev/null
  done
}

up() {
  [ "$(id -u)" = 0 ] || die "run as root: it adds a network namespace and starts a dockerd"
  docker info >/dev/null 2>&1 || die "the host's Docker engine does not answer"
  local manager
  make_namespace
  start_dockerd
  manager=$(ensure_host_swarm)
  route_from_manager_address "$manager"
  join_node2 "$manager"
  wait_ready_and_label
  load_images
  status
}

# --- down ----------------------------------------------------------------------------------

remove_node2_from_swarm() {
  dockerd_running || return 0
  local id
  id=$(node2_id 2>/dev/null || true)
  if [ "$(swarm_state node2)" != inactive ]; then
    node2 swarm leave --force >/dev/null 2>&1 || true
  fi
  # The manager keeps a Down entry for a node that left; drop it (only ours, by its ID).
  if [ -n "$id" ] && docker node inspect "$id" >/dev/null 2>&1; then
    for _ in $(seq 1 40); do
      [ "$(docker node inspect "$id" --format '{{.Status.State}}' 2>/dev/null)" = down ] && break
      sleep 0.5
    done
    docker node rm --force "$id" >/dev/null 2>&1 || true
  fi
}

stop_dockerd() {
  dockerd_running || { rm -f "$PIDFILE"; return 0; }
  local pid
  pid=$(cat "$PIDFILE")
  kill "$pid"
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  rm -f "$PIDFILE"
}

leave_host_swarm_if_ours() {
  [ -e "$SWARM_MARKER" ] || return 0
  if [ "$(swarm_state docker)" = active ]; then
    # Others may have started using the swarm `up` made (a test that found it active): leaving
    # would kill their services, so it stays until they are gone and `down` runs again.
    if [ -n "$(docker service ls -q)" ]; then
      say "the host's swarm (made by \`up\`) still has services of others: left in place; run \`down\` again later"
      return 0
    fi
    say "leaving the swarm that \`up\` initialised on the host engine"
    docker swarm leave --force >/dev/null
    # Swarm leaves docker_gwbridge behind; it is ours when no container uses it.
    if [ "$(docker network inspect docker_gwbridge --format '{{len .Containers}}' 2>/dev/null)" = 0 ]; then
      docker network rm docker_gwbridge >/dev/null 2>&1 || true
    fi
  fi
  rm -f "$SWARM_MARKER"
}

down() {
  [ "$(id -u)" = 0 ] || die "run as root"
  remove_node2_from_swarm
  stop_dockerd
  ip link show "$VETH_HOST" >/dev/null 2>&1 && ip link del "$VETH_HOST"  # takes its peer along
  [ -e "/var/run/netns/$NS" ] && ip netns del "$NS"
  leave_host_swarm_if_ours
  rm -rf "$EXEC_ROOT"
  say "down"
}

# --- status --------------------------------------------------------------------------------

status() {
  local ok=0
  if dockerd_running; then say "node2's dockerd: running (pid $(cat "$PIDFILE"))"; else say "node2's dockerd: not running"; ok=1; fi
  say "host engine's swarm: $(swarm_state docker)$([ -e "$SWARM_MARKER" ] && echo ' (initialised by up)')"
  if [ "$(swarm_state docker)" = active ] && [ "$(docker info --format '{{.Swarm.ControlAvailable}}')" = true ]; then
    docker node ls --format '  {{.Hostname}} {{.Status}} {{.Availability}} {{.ManagerStatus}}' >&2
  fi
  if dockerd_running && [ "$(swarm_state node2)" = active ] \
      && [ "$(docker node inspect "$(node2_id)" --format '{{.Status.State}}' 2>/dev/null)" = ready ]; then
    say "node2: Ready in the host's swarm"
  else
    say "node2: not in the host's swarm"; ok=1
  fi
  return $ok
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  purge) down; rm -rf "$DATA_ROOT"; say "removed $DATA_ROOT" ;;
  status) status ;;
  *) echo "usage: $0 up|down|status|purge" >&2; exit 2 ;;
esac
