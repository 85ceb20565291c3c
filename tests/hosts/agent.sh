#!/bin/bash
# An ssh stand-in for OpenMPI (`--mca plm_rsh_agent tests/hosts/agent.sh`): takes ssh's
# arguments (options, the host, then the command), drops the options and runs the command
# inside that test host's network and UTS namespaces (tests/hosts/hosts.sh). The host is
# a name loomhK or an address 10.231.0.K. Like ssh, the command words are joined and run
# by a shell.
set -u
STATE=/run/loom-hosts
while [ $# -gt 0 ]; do
    case "$1" in
    -[46AaCfGgKkMNnqsTtVvXxYy]*) shift ;; # ssh flags without a value
    -[BbcDEeFIiJLlmOoPpQRSWw]) shift 2 ;; # ssh options with a separate value
    -*) shift ;;                          # an option with its value attached (-oFoo=bar)
    *) break ;;
    esac
done
host=${1:-}
[ $# -ge 2 ] || {
    echo "agent.sh: expected [ssh options] HOST COMMAND..., got '$*'" >&2
    exit 255
}
shift
host=${host#*@} # user@host
case "$host" in
loomh[0-9]*) k=${host#loomh} ;;
10.231.0.[0-9]*) k=${host##*.} ;;
*)
    echo "agent.sh: host '$host': expected loomhK or 10.231.0.K (a test host)" >&2
    exit 255
    ;;
esac
pid=$(cat "$STATE/loomh$k.pid" 2>/dev/null)
if [ -z "$pid" ] || [ ! -e "/run/netns/loomh$k" ] || [ ! -e "/proc/$pid/ns/uts" ]; then
    echo "agent.sh: host '$host' (loomh$k) is not up: run tests/hosts/hosts.sh up N" >&2
    exit 255
fi
exec nsenter --net="/run/netns/loomh$k" --uts="/proc/$pid/ns/uts" /bin/sh -c "$*"
