#!/usr/bin/env bash
# Two sites joined by one slow link, in network namespaces (issue 12: the
# supernode tests and `bench/run.sh hier`). Everything lives in namespaces
# named PREFIX-*; the addresses exist only inside them.
#
#   two_sites.sh up PREFIX [--per_site=3] [--rate=20mbit] [--nat]
#   two_sites.sh down PREFIX         removes every PREFIX-* namespace
#   two_sites.sh bytes PREFIX        bytes over the inter-site link so far
#                                    (both directions, one line: a number)
#   two_sites.sh check               exit 0 when namespaces can be made here
#
# Layout (one L2 segment, 10.78.0.0/24, split in two by the link):
#
#   site A: PREFIX-A (bridge br0)              site B: PREFIX-B (bridge br0)
#     PREFIX-c   10.78.0.1  coordinator          PREFIX-b1  10.78.0.21
#     PREFIX-a1  10.78.0.11                      PREFIX-b2  10.78.0.22 ...
#     PREFIX-a2  10.78.0.12 ...
#     PREFIX-A:wan <======= tc tbf RATE each way ========> PREFIX-B:wan
#
# Each worker namespace has its own veth to its site's bridge (unshaped), so
# traffic inside a site never crosses `wan` and all traffic between the
# sites does; `bytes` reads the counters of PREFIX-A's end of it.
#
# --nat adds a worker behind a NAT router in site A:
#   PREFIX-r   router: 10.78.0.50 on site A's bridge, 192.168.78.1 inside,
#              iptables MASQUERADE out of its public side
#   PREFIX-n1  192.168.78.2, default route via the router
# Nothing outside routes to 192.168.78.0/24: PREFIX-n1 can open connections
# to the sites, nobody can open one to it.
#
# Prints nothing on success; a failure names the command. Needs root (or
# CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2's ip and tc, and iptables for
# --nat.
set -euo pipefail

SUBNET=10.78.0
PRIVATE=192.168.78

cmd=${1:-}
prefix=${2:-}
per_site=3
rate=20mbit
nat=0
for arg in "${@:3}"; do
  case "$arg" in
    --per_site=*) per_site=${arg#*=} ;;
    --rate=*) rate=${arg#*=} ;;
    --nat) nat=1 ;;
    *) echo "two_sites.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

run() {
  local out
  if ! out=$("$@" 2>&1); then
    echo "two_sites.sh: '$*' failed: $out" >&2
    return 1
  fi
}

namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}-" || true
}

down() {
  local ns
  # Deleting a namespace deletes its veth ends (and their peers) and qdiscs.
  for ns in $(namespaces); do
    ip netns del "$ns" 2>/dev/null || true
  done
}

new_ns() {
  run ip netns add "$1"
  run ip -n "$1" link set lo up
}

# attach SWITCH_NS NS PORT ADDR/LEN: a veth from NS (eth0) to the switch's br0.
attach() {
  run ip -n "$1" link add name "$3" type veth peer name eth0 netns "$2"
  run ip -n "$1" link set "$3" master br0
  run ip -n "$1" link set "$3" up
  run ip -n "$2" addr add "$4" dev eth0
  run ip -n "$2" link set eth0 up
}

shape() {
  # burst: a few ms of the rate; latency bounds the queue.
  run tc -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst 32kb latency 200ms
}

up() {
  [[ "$per_site" =~ ^[1-9]$ ]] || { echo "two_sites.sh: --per_site must be 1-9" >&2; exit 2; }
  down
  trap 'down' ERR
  new_ns "$prefix-A"
  new_ns "$prefix-B"
  local s
  for s in A B; do
    run ip -n "$prefix-$s" link add name br0 type bridge
    run ip -n "$prefix-$s" link set br0 up
  done
  run ip -n "$prefix-A" link add name wan type veth peer name wan netns "$prefix-B"
  for s in A B; do
    run ip -n "$prefix-$s" link set wan master br0
    run ip -n "$prefix-$s" link set wan up
    shape "$prefix-$s" wan
  done
  new_ns "$prefix-c"
  attach "$prefix-A" "$prefix-c" c "$SUBNET.1/24"
  local i
  for i in $(seq 1 "$per_site"); do
    new_ns "$prefix-a$i"
    attach "$prefix-A" "$prefix-a$i" "a$i" "$SUBNET.1$i/24"
    new_ns "$prefix-b$i"
    attach "$prefix-B" "$prefix-b$i" "b$i" "$SUBNET.2$i/24"
  done
  if [[ "$nat" == 1 ]]; then
    new_ns "$prefix-r"
    attach "$prefix-A" "$prefix-r" r "$SUBNET.50/24"
    new_ns "$prefix-n1"
    run ip -n "$prefix-r" link add name lan type veth peer name eth0 netns "$prefix-n1"
    run ip -n "$prefix-r" addr add "$PRIVATE.1/24" dev lan
    run ip -n "$prefix-r" link set lan up
    run ip -n "$prefix-n1" addr add "$PRIVATE.2/24" dev eth0
    run ip -n "$prefix-n1" link set eth0 up
    run ip -n "$prefix-n1" route add default via "$PRIVATE.1"
    run ip netns exec "$prefix-r" sysctl -q -w net.ipv4.ip_forward=1
    run ip netns exec "$prefix-r" iptables -t nat -A POSTROUTING -o eth0 -j MASQUERADE
  fi
  trap - ERR
}

bytes() {
  local tx rx
  tx=$(ip netns exec "$prefix-A" cat /sys/class/net/wan/statistics/tx_bytes)
  rx=$(ip netns exec "$prefix-A" cat /sys/class/net/wan/statistics/rx_bytes)
  echo $((tx + rx))
}

check() {
  prefix="shoal-check-$$"
  command -v ip >/dev/null && command -v tc >/dev/null || return 1
  if ! ip netns add "$prefix-x" 2>/dev/null; then return 1; fi
  ip netns del "$prefix-x"
}

case "$cmd" in
  up) [[ -n "$prefix" ]] || exit 2; up ;;
  down) [[ -n "$prefix" ]] || exit 2; down ;;
  bytes) [[ -n "$prefix" ]] || exit 2; bytes ;;
  check) check ;;
  *) sed -n '2,30p' "$0" >&2; exit 2 ;;
esac
