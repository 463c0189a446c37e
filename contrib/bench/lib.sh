# Shared by the bench_*.sh scripts; source it after setting BENCH_NAME and PORT.
#   die MSG...                    print "BENCH_NAME: MSG" and exit 1
#   start_server NAME SECS CMD... run CMD in the background; wait up to SECS until it listens
#                                 on $PORT (asking the kernel: some servers buffer their
#                                 "waiting" line); its output goes to $LOGDIR/NAME.log
#   next_port                     the next server's port
# Every server started is killed, and LOGDIR removed, when the script exits.

die() { echo "$BENCH_NAME: $*" >&2; exit 1; }

LOGDIR=$(mktemp -d)
SERVERS=()
bench_cleanup() {
    local pid
    for pid in "${SERVERS[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$LOGDIR"
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

start_server() {
    local name=$1 secs=$2 log=$LOGDIR/$1.log
    shift 2
    "$@" >"$log" 2>&1 &
    SERVERS+=($!)
    for _ in $(seq $((secs * 10))); do
        [ -n "$(ss -Hltn "sport = :$PORT")" ] && return 0
        kill -0 "${SERVERS[-1]}" 2>/dev/null || { cat "$log" >&2; die "$name server exited"; }
        sleep 0.1
    done
    cat "$log" >&2
    die "$name server did not start in $secs s"
}

next_port() { PORT=$((PORT + 1)); }
