# Two "hosts" on one machine for multi-host tests and benchmarks (sourced by bash scripts):
# network namespaces kolo-h1-ID and kolo-h2-ID, each with a veth (eth0) whose peer sits in
# a bridge namespace kolo-br-ID, addresses 10.213.X.1/24 and 10.213.X.2/24. Nothing in the
# root namespace changes. Functions: netns_supported, netns_create, netns_destroy, and for
# test scripts netns_test_begin.

NETNS_ID="${NETNS_ID:-$$}"
NETNS_H1="kolo-h1-$NETNS_ID"
NETNS_H2="kolo-h2-$NETNS_ID"
NETNS_BR="kolo-br-$NETNS_ID"
NETNS_SUBNET="10.213.$((NETNS_ID % 250)).0"
NETNS_ADDR1="10.213.$((NETNS_ID % 250)).1"
NETNS_ADDR2="10.213.$((NETNS_ID % 250)).2"

# Prints why namespaces cannot be used here (and returns 1), or returns 0.
netns_supported() {
  if ! command -v ip >/dev/null 2>&1; then echo "the ip command (iproute2) is missing"; return 1; fi
  if [ "$(id -u)" != 0 ]; then echo "creating network namespaces needs root"; return 1; fi
  local probe="kolo-probe-$NETNS_ID"
  if ! ip netns add "$probe" 2>/dev/null; then echo "this machine forbids network namespaces (ip netns add failed)"; return 1; fi
  if ! ip -n "$probe" link add kprobe0 type veth peer name kprobe1 2>/dev/null; then
    ip netns del "$probe" 2>/dev/null
    echo "veth pairs cannot be created here"
    return 1
  fi
  ip netns del "$probe" 2>/dev/null
  return 0
}

# Creates both hosts and the bridge between them.
netns_create() {
  ip netns add "$NETNS_BR"
  ip netns add "$NETNS_H1"
  ip netns add "$NETNS_H2"
  ip -n "$NETNS_BR" link add br0 type bridge
  ip -n "$NETNS_BR" link set br0 up
  local i ns addr
  for i in 1 2; do
    if [ $i = 1 ]; then ns="$NETNS_H1"; addr="$NETNS_ADDR1"; else ns="$NETNS_H2"; addr="$NETNS_ADDR2"; fi
    ip -n "$ns" link add eth0 type veth peer name port$i netns "$NETNS_BR"
    ip -n "$NETNS_BR" link set port$i master br0
    ip -n "$NETNS_BR" link set port$i up
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
}

# Gives each host a name that both resolve, as on a cluster: /etc/netns/<ns>/hosts, which
# `ip netns exec` mounts over /etc/hosts, maps kolo-h1-ID and kolo-h2-ID to their addresses.
# A command sees its host's name when started with netns_on. netns_destroy removes the files.
netns_name_hosts() {
  local ns
  for ns in "$NETNS_H1" "$NETNS_H2"; do
    mkdir -p "/etc/netns/$ns"
    printf '127.0.0.1 localhost\n%s %s\n%s %s\n' "$NETNS_ADDR1" "$NETNS_H1" \
      "$NETNS_ADDR2" "$NETNS_H2" >"/etc/netns/$ns/hosts"
  done
}

# netns_on NS COMMAND...: runs COMMAND on host NS under that host's name (a UTS namespace of
# its own, so gethostname says NS).
netns_on() {
  local ns="$1"
  shift
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
}

# Removes the namespaces (their interfaces go with them) and the hosts files; safe to call
# twice.
netns_destroy() {
  ip netns del "$NETNS_H1" 2>/dev/null || true
  ip netns del "$NETNS_H2" 2>/dev/null || true
  ip netns del "$NETNS_BR" 2>/dev/null || true
  rm -rf "/etc/netns/$NETNS_H1" "/etc/netns/$NETNS_H2"
  rmdir /etc/netns 2>/dev/null || true
}

# netns_test_begin WHAT [fashion-mnist]: the start of a test script. Exits 77 (ctest SKIP),
# naming WHAT, where namespaces cannot be used or (when asked) Fashion-MNIST is missing;
# otherwise creates the hosts and a work directory $dir, and on exit kills the PIDs the
# script put in $pids and removes both.
netns_test_begin() {
  local what="$1" why
  if ! why="$(netns_supported)"; then
    echo "SKIPPED: $what: $why"
    exit 77
  fi
  if [ "${2:-}" = fashion-mnist ] && [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "SKIPPED: $what: Fashion-MNIST is not installed"
    exit 77
  fi
  dir=""
  pids=()
  trap netns_test_end EXIT
  netns_create
  dir="$(mktemp -d /tmp/kolo-netns-test.XXXXXX)"
}

netns_test_end() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  netns_destroy
  [ -n "$dir" ] && rm -rf "$dir"
}
