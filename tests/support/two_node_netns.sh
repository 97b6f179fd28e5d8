# Sourced by the multi-node test scripts: two "machines" on one, i.e. two network namespaces
# joined by a veth pair, each with its own address. After
#   two_node_netns_up TAG SUBNET        (e.g. two_node_netns_up c 10.231.9)
# the caller has $ns_a $ns_b (namespaces), $veth_a $veth_b (the link's ends), $addr_a $addr_b
# (SUBNET.1 and SUBNET.2) and a scratch directory $work; everything is removed on exit (an EXIT
# trap kills what runs in the namespaces). Without root or iproute2 it exits 77, which ctest
# reports as Skipped.

two_node_netns_down() {
  ip netns pids "$ns_a" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns pids "$ns_b" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  rm -rf "$work"
}

two_node_netns_up() {
  local tag=$1 subnet=$2 suffix=$$
  ns_a=nddp-${tag}a-$suffix ns_b=nddp-${tag}b-$suffix
  veth_a=nddp${tag}a$suffix veth_b=nddp${tag}b$suffix
  addr_a=$subnet.1 addr_b=$subnet.2
  work=$(mktemp -d)
  trap two_node_netns_down EXIT
  if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
    echo "SKIPPED: needs root and iproute2 to create network namespaces"
    exit 77
  fi
  if ! ip netns add "$ns_a" 2>/dev/null; then
    echo "SKIPPED: cannot create network namespaces here"
    exit 77
  fi
  ip netns add "$ns_b"
  ip link add "$veth_a" type veth peer name "$veth_b"
  ip link set "$veth_a" netns "$ns_a"
  ip link set "$veth_b" netns "$ns_b"
  ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a"
  ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b"
  for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
  ip -n "$ns_a" link set "$veth_a" up
  ip -n "$ns_b" link set "$veth_b" up
}
