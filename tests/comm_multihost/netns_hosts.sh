# Two "hosts" on one machine for multi-host tests and benchmarks (sourced by bash scripts):
# network namespaces kolo-h1-ID and kolo-h2-ID, each with a veth (eth0) whose peer sits in
# a bridge namespace kolo-br-ID, addresses 10.213.X.1/24 and 10.213.X.2/24. Nothing in the
# root namespace changes. Functions: netns_supported, netns_create, netns_destroy.

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

# Removes the namespaces (their interfaces go with them); safe to call twice.
netns_destroy() {
  ip netns del "$NETNS_H1" 2>/dev/null || true
  ip netns del "$NETNS_H2" 2>/dev/null || true
  ip netns del "$NETNS_BR" 2>/dev/null || true
}
