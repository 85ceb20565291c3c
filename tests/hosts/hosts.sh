#!/bin/bash
# Test hosts on one machine: N network namespaces loomh1..loomhN on one bridge, each with
# its own veth, address, loopback and hostname (a UTS namespace held by one long-lived
# process per host). Traffic stays on the private subnet; /etc/hosts is not touched.
#
#   hosts.sh up N      make hosts 1..N (N <= 8); idempotent: what exists and is right is
#                      kept, what is missing or half-made (a crash) is made again
#   hosts.sh down      remove every test host, the bridge and the holders, kill what still
#                      runs inside the hosts, and verify nothing is left (exit 1 if it is)
#   hosts.sh status    one line per host (name, address, holder pid), exit 1 if none
#   hosts.sh exec K CMD...   run CMD inside host K (network + UTS namespace)
#   hosts.sh addr K    host K's address;   hosts.sh subnet   the subnet (CIDR)
#
# Host K is 10.231.0.K/24 (eth0 inside it, loomvK on the bridge side); the bridge loombr0
# is 10.231.0.254/24, this machine's address on the hosts' network. The links (both ends of
# each veth, and the bridge) have MTU 65535, as loopback has: with 1500, OpenMPI's TCP
# transport between two hosts moved ~0.55-0.7 GB/s one way, with 65535 ~1.1-1.6 GB/s
# (fewer packets and ACKs per byte on 2 shared cores; bench/bench_mpi_tcp.py). Host K is
# entered by
#   nsenter --net=/run/netns/loomhK --uts=/proc/$(cat /run/loom-hosts/loomhK.pid)/ns/uts
# (tests/hosts/agent.sh does that for mpirun). Needs root.
# shellcheck disable=SC2015 # `a && b || die`: die when either fails, on purpose
set -u
PREFIX=10.231.0
MTU=65535
SUBNET=$PREFIX.0/24
BRIDGE=loombr0
BRIDGE_ADDR=$PREFIX.254
STATE=/run/loom-hosts
MAX=8
MARK=loom-hosts-holder # argv[0] of the holders: found again if the pid files are lost

die() {
    echo "hosts.sh: $*" >&2
    exit 2
}

need_root() {
    [ "$(id -u)" = 0 ] || die "needs root (ip netns, veth, unshare); running as uid $(id -u)"
    command -v ip >/dev/null || die "'ip' (iproute2) not found"
    command -v unshare >/dev/null && command -v nsenter >/dev/null ||
        die "'unshare'/'nsenter' (util-linux) not found"
}

alive() { [ -n "${1:-}" ] && [ -d "/proc/$1" ] && { tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null | grep -q "^$MARK"; }

holder_pid() { # the recorded holder of host $1, if it is alive
    local p
    p=$(cat "$STATE/loomh$1.pid" 2>/dev/null) || return 1
    alive "$p" && [ "$(nsenter --uts="/proc/$p/ns/uts" hostname 2>/dev/null)" = "loomh$1" ] &&
        echo "$p"
}

up_host() {
    local k=$1 h=loomh$1 v=loomv$1
    ip netns list | grep -qw "^$h" || ip netns add "$h" || die "ip netns add $h failed"
    if ! ip -n "$h" link show eth0 >/dev/null 2>&1; then
        ip link del "$v" >/dev/null 2>&1
        ip link add "$v" type veth peer name "${v}p" || die "$h: cannot create veth $v"
        ip link set "${v}p" netns "$h" || die "$h: cannot move the veth into the namespace"
        ip -n "$h" link set "${v}p" name eth0 || die "$h: cannot rename the veth to eth0"
    fi
    ip -n "$h" link set eth0 mtu $MTU && ip link set "$v" mtu $MTU || die "$h: cannot set MTU $MTU"
    ip -n "$h" addr replace "$PREFIX.$k/24" dev eth0 || die "$h: cannot set $PREFIX.$k/24"
    ip -n "$h" link set lo up && ip -n "$h" link set eth0 up || die "$h: cannot set links up"
    ip link set "$v" master "$BRIDGE" && ip link set "$v" up || die "$h: cannot attach $v"
    if ! holder_pid "$k" >/dev/null; then
        local old
        old=$(cat "$STATE/$h.pid" 2>/dev/null) && alive "$old" && kill -9 "$old"
        rm -f "$STATE/$h.pid"
        # The holder: a new UTS namespace named $h, then a sleep with a recognisable argv[0].
        # shellcheck disable=SC2016 # expanded by the inner bash
        setsid unshare --uts bash -c 'hostname "$1" && echo $$ >"$2.tmp" && mv "$2.tmp" "$2" &&
            exec -a "$3 $1" sleep infinity' _ "$h" "$STATE/$h.pid" "$MARK" \
            </dev/null >/dev/null 2>&1 &
        local _
        for _ in $(seq 50); do
            holder_pid "$k" >/dev/null && break
            sleep 0.05
        done
        holder_pid "$k" >/dev/null || die "$h: the UTS holder did not start (unshare --uts)"
    fi
}

cmd_up() {
    local n=${1:-}
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le $MAX ] ||
        die "up N: expected a number of hosts 1..$MAX, got '${n}'"
    need_root
    mkdir -p "$STATE" || die "cannot create $STATE"
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge ||
        die "cannot create the bridge $BRIDGE"
    ip link set "$BRIDGE" mtu $MTU && ip addr replace "$BRIDGE_ADDR/24" dev "$BRIDGE" &&
        ip link set "$BRIDGE" up ||
        die "cannot set up $BRIDGE ($BRIDGE_ADDR/24)"
    local k
    for k in $(seq "$n"); do up_host "$k"; done
    echo "$n" >"$STATE/count"
    cmd_status >/dev/null || die "up $n: the hosts are not all up (hosts.sh status)"
}

holders() { # every holder process, recorded or not
    local p
    for p in /proc/[0-9]*; do
        { tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null | grep -q "^$MARK" && echo "${p#/proc/}"
    done
}

cmd_down() {
    need_root
    local h p
    for h in $(ip netns list | awk '{print $1}' | grep '^loomh[0-9]*$'); do
        for p in $(ip netns pids "$h" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
        ip netns del "$h" 2>/dev/null
    done
    for p in $(holders); do kill -9 "$p" 2>/dev/null; done
    for h in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep '^loomv[0-9]*$'); do
        ip link del "$h" 2>/dev/null
    done
    ip link del "$BRIDGE" 2>/dev/null
    rm -rf "$STATE"
    sleep 0.1 # killed holders are reaped by their parent (init)
    local left=""
    ip netns list | grep -q '^loomh' && left+=" netns:$(ip netns list | grep '^loomh' | tr '\n' ' ')"
    ip link show "$BRIDGE" >/dev/null 2>&1 && left+=" bridge:$BRIDGE"
    ip -o link show | grep -q ': loomv' && left+=" veth"
    [ -n "$(holders)" ] && left+=" holders:$(holders | tr '\n' ' ')"
    [ -z "$left" ] || {
        echo "hosts.sh: down: still there:$left" >&2
        exit 1
    }
}

cmd_status() {
    local n k p ok=0
    n=$(cat "$STATE/count" 2>/dev/null) || {
        echo "no test hosts"
        return 1
    }
    for k in $(seq "$n"); do
        p=$(holder_pid "$k") || p=""
        if [ -n "$p" ] && ip -n "loomh$k" addr show eth0 2>/dev/null | grep -q "$PREFIX.$k/"; then
            echo "loomh$k $PREFIX.$k holder $p"
        else
            echo "loomh$k BROKEN (netns, address or holder missing: run up again)"
            ok=1
        fi
    done
    echo "bridge $BRIDGE $BRIDGE_ADDR subnet $SUBNET"
    return $ok
}

case "${1:-}" in
up) cmd_up "${2:-}" ;;
down) cmd_down ;;
status) cmd_status ;;
exec)
    [[ "${2:-}" =~ ^[0-9]+$ ]] || die "exec K CMD: expected a host number, got '${2:-}'"
    k=$2
    shift 2
    p=$(holder_pid "$k") || die "exec: host loomh$k is not up (hosts.sh up N)"
    exec nsenter --net="/run/netns/loomh$k" --uts="/proc/$p/ns/uts" "$@"
    ;;
addr) echo "$PREFIX.${2:?hosts.sh addr K}" ;;
subnet) echo "$SUBNET" ;;
bridge) echo "$BRIDGE_ADDR" ;;
*) die "usage: hosts.sh up N | down | status | exec K CMD... | addr K | subnet | bridge" ;;
esac
