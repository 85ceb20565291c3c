#!/bin/bash
# A real Slurm cluster on the test hosts (tests/hosts/hosts.sh): Debian's slurm-wlm 22.05
# and munge. munged and slurmctld run in this machine's own namespaces; one slurmd runs
# in each test host (entered with nsenter --net/--uts, so /sys/fs/cgroup stays visible),
# with a private /tmp (a mount namespace with a bind mount: PMIx's per-step directories
# would collide in a shared /tmp). Slurm's state, spool and logs live under $STATE, outside
# /tmp. No cgroups: proctrack/linuxproc, task/none. /etc is not touched: the commands find
# the configuration through SLURM_CONF (slurm.sh env).
#
#   slurm.sh up N     hosts.sh up N, then munged, slurmctld and slurmd on hosts 1..N; waits
#                     (bounded) until every node is idle. Idempotent: a cluster that is up
#                     and right is kept; anything half-made (a crash) is stopped and made again
#   slurm.sh down     stops every daemon and job step it started, waits (bounded) until they
#                     have exited, removes $STATE, and verifies nothing is left (exit 1
#                     if something is). The test hosts stay
#                     (hosts.sh down removes them)
#   slurm.sh status   sinfo, exit 1 if the cluster is not up
#   slurm.sh env      the environment the Slurm commands need (eval "$(slurm.sh env)")
#   slurm.sh conf     the slurm.conf it writes
# Needs root, slurm-wlm and munge (scripts/setup.sh installs them).
# shellcheck disable=SC2015 # `a && b || die`: die when either fails, on purpose
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
HOSTS_SH=$HERE/hosts.sh
STATE=/var/lib/loom-slurm
CONF=$STATE/slurm.conf
MUNGE_SOCKET=$STATE/munge/munge.socket
PREFIX=10.231.0
CTLD_ADDR=$PREFIX.254
export SLURM_CONF=$CONF

die() {
    echo "slurm.sh: $*" >&2
    exit 2
}

need() {
    [ "$(id -u)" = 0 ] || die "needs root (slurmd, munged, namespaces); running as uid $(id -u)"
    local t
    for t in munged slurmctld slurmd sinfo scontrol nsenter unshare; do
        command -v "$t" >/dev/null || die "'$t' not found (apt-get install slurm-wlm munge)"
    done
}

conf() { # slurm.conf for hosts 1..$1
    local n=$1
    cat <<EOF
# loom's test cluster (tests/hosts/slurm.sh): slurmctld on this machine, one slurmd per
# network-namespace host, no cgroups, everything as root.
ClusterName=loom
SlurmctldHost=$(hostname)($CTLD_ADDR)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=30
InactiveLimit=0
NodeName=loomh[1-$n] NodeAddr=$PREFIX.[1-$n] CPUs=2 RealMemory=2000 State=UNKNOWN
PartitionName=loom Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

# Processes of this cluster: the daemons and the job steps' slurmstepd (the tasks are
# their children).
ours() {
    pgrep -f "^(munged|slurmctld|slurmd) .*$STATE" # command lines name $STATE
    pgrep -x slurmstepd                           # no other Slurm runs on a test machine
}

# Those still alive: a zombie has exited (only its parent has not collected it yet).
ours_alive() {
    local p
    for p in $(ours); do
        [ -e "/proc/$p" ] && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ] && echo "$p"
    done
}

stop_all() {
    local p
    # A clean stop when it can answer (without munged, scontrol would retry for long).
    [ -f "$CONF" ] && pgrep -f "^munged .*$STATE" >/dev/null &&
        timeout 10 scontrol shutdown >/dev/null 2>&1
    for _ in $(seq 30); do
        [ -z "$(pgrep -f "^(slurmctld|slurmd) .*$STATE")" ] && break
        sleep 0.1
    done
    # Then SIGKILL to what is left, again until every one has exited (bounded: 10 s; a
    # killed process takes a moment to exit on a busy machine, and a step may still be
    # starting its tasks). A job step's tasks first: every process below a slurmstepd.
    local alive
    for _ in $(seq 100); do
        alive=$(ours_alive)
        [ -z "$alive" ] && return 0
        for p in $alive; do
            [ "$(cat "/proc/$p/comm" 2>/dev/null)" = slurmstepd ] && pkill -9 -P "$p" 2>/dev/null
        done
        for p in $alive; do kill -9 "$p" 2>/dev/null; done
        sleep 0.1
    done
}

cmd_down() {
    need
    stop_all # returns once every daemon and step has exited, or after its bound
    rm -rf "$STATE"
    local left
    left=$(ours_alive | tr '\n' ' ')
    [ -z "$left" ] && [ ! -e "$STATE" ] || {
        echo "slurm.sh: down: still there after 10 s: pids $left $( [ -e "$STATE" ] && echo "$STATE")" >&2
        exit 1
    }
}

holder() { cat "/run/loom-hosts/loomh$1.pid" 2>/dev/null; }

idle() { # every node 1..$1 idle
    local out
    out=$(sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
    [ "$(echo "$out" | grep -c ' idle$')" -ge "$1" ]
}

cmd_up() {
    local n=${1:-}
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 8 ] ||
        die "up N: expected a number of hosts 1..8, got '$n'"
    need
    # The daemons outlive this script: they must not inherit its open files (a caller's
    # lock on /run/loom-hosts.lock would be held by munged or a host holder for ever).
    local fd
    for fd in "/proc/$$/fd"/*; do
        fd=${fd##*/}
        [ "$fd" -gt 2 ] && eval "exec $fd>&-" 2>/dev/null
    done
    bash "$HOSTS_SH" up "$n" || die "hosts.sh up $n failed"
    if [ -f "$CONF" ] && [ "$(conf "$n")" = "$(cat "$CONF")" ] && idle "$n"; then
        return 0 # up and right
    fi
    stop_all
    rm -rf "$STATE"
    mkdir -p "$STATE"/{munge,ctld,run,log} || die "cannot create $STATE"
    conf "$n" >"$CONF"
    chmod 700 "$STATE/munge"
    # munged with a key of its own (the system's /etc/munge is left alone).
    dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none &&
        chmod 400 "$STATE/munge/munge.key" || die "cannot make a munge key"
    munged --force --key-file="$STATE/munge/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/log/munged.log" \
        --seed-file="$STATE/munge/munged.seed" || die "munged did not start ($STATE/log/munged.log)"
    slurmctld -f "$CONF" -i || die "slurmctld did not start ($STATE/log/slurmctld.log)"
    local k p
    for k in $(seq "$n"); do
        mkdir -p "$STATE/tmp/loomh$k" "$STATE/spool/loomh$k" && chmod 1777 "$STATE/tmp/loomh$k"
        p=$(holder "$k") || die "host loomh$k has no UTS holder"
        # shellcheck disable=SC2016 # expanded by the inner shell
        nsenter --net="/run/netns/loomh$k" --uts="/proc/$p/ns/uts" \
            unshare --mount --propagation private sh -c \
            'mount --bind "$1" /tmp && exec slurmd -f "$2" -N "$3"' _ \
            "$STATE/tmp/loomh$k" "$CONF" "loomh$k" ||
            die "slurmd on loomh$k did not start ($STATE/log/slurmd-loomh$k.log)"
    done
    for _ in $(seq 150); do
        idle "$n" && return 0
        sleep 0.2
    done
    sinfo -N >&2
    die "up $n: the nodes are not idle after 30 s ($STATE/log)"
}

case "${1:-}" in
up) cmd_up "${2:-}" ;;
down) cmd_down ;;
status) sinfo -N && idle 1 ;;
env) echo "export SLURM_CONF=$CONF" ;;
conf) conf "${2:-2}" ;;
*) die "usage: slurm.sh up N | down | status | env | conf [N]" ;;
esac
