# Shared by the bench_*.sh scripts; source it after setting BENCH_NAME and PORT.
#   die MSG...                    print "BENCH_NAME: MSG" and exit 1
#   start_server NAME SECS CMD... run CMD in the background; wait up to SECS until it listens
#                                 on $PORT (asking the kernel: some servers buffer their
#                                 "waiting" line); its output goes to $LOGDIR/NAME.log
#   next_port                     the next server's port
#   run_pair NAME SECS SERVER_CMD... -- CLIENT_CMD...
#                                 start_server NAME for SERVER_CMD, then CLIENT_CMD for at most
#                                 SECS seconds; its stdout goes to PAIR_OUT; then next_port. The
#                                 server, which serves one client, is waited for and forgotten.
#                                 When the client fails or runs out of time: a line and its
#                                 output on stderr, the server killed, status 1 (the caller
#                                 decides whether that ends the script)
#   xfer_tcp TEST SIZE ITERS [ARG...]
#                                 run_pair of xfer_perf -x tcp ($PERF) on 127.0.0.1: PAIR_OUT is
#                                 its --json object
#   ucx_tcp TEST SIZE ITERS [ARG...]
#                                 run_pair of ucx_perftest with UCX_TLS=tcp UCX_NET_DEVICES=lo on
#                                 127.0.0.1: PAIR_OUT is its final CSV line (-f -v): iterations,
#                                 lat50,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr
#                                 (latencies in usec, bandwidths in MB of UCX_MB)
#   UCX_MB                        ucx_perftest's MB (2^20 bytes) in MB of 10^6 bytes
#   RUN_TIMEOUT                   SECS of xfer_tcp's and ucx_tcp's clients (default 300)
#   bench_out_args ARG...         takes --out DIR / --out=DIR into OUT (default .) and -h (the
#                                 script's header comment, then exit 0); the rest in BENCH_ARGS
#   ROUNDS                        rounds of every figure (default 9, at least 9: one run on a
#                                 2-core VM is bimodal and proves nothing; BENCH_FEW_ROUNDS=1
#                                 allows fewer for a try-out, and every table then says so)
#   rounds_header                 the line every table starts with: how many rounds, and how
#   round_first ROUND             true when this round runs the first of a pair first: pairs
#                                 alternate their order round by round, so that a drift of
#                                 the machine (which cores the processes get) reaches both
#   round_pair CMD...             the runs of one comparison (each argument one command line,
#                                 split on spaces), in this order in odd rounds ($round) and
#                                 the other way round in even ones
#   round_add NAME VALUE          one round's figure of NAME (a number, or die)
#   round_ratio A B               one round's A / B, from the figures A and B just added,
#                                 as R_A_B (the ratio of a pair is taken within a round)
#   round_median NAME             NAME becomes the median of its rounds, NAME_RANGE "lo-hi"
#   AWK_AIMS                      awk functions aims_header() and aim(what, a, b, unit, op,
#                                 bound[, ratio, range]): one line per aim, the two figures,
#                                 their ratio (a / b, or the ratio given: a median of rounds,
#                                 its range printed after the verdict), the bound and the
#                                 verdict; the what column is aim_w wide (-v)
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

# Wait up to SECS for the last server started to exit (it serves one client), kill it if it
# has not, and forget it: the script's exit then kills no process id that may have been reused.
stop_last_server() {
    local pid=${SERVERS[-1]} secs=$1
    for _ in $(seq $((secs * 10))); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
    unset 'SERVERS[-1]'
}

run_pair() {
    local name=$1 secs=$2 server=() rc=0
    shift 2
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        server+=("$1")
        shift
    done
    [ $# -gt 1 ] || die "run_pair $name: no client command after --"
    shift
    start_server "$name" 10 "${server[@]}"
    PAIR_OUT=$(timeout "$secs" "$@" 2>"$LOGDIR/$name.client.log") || rc=$?
    if [ "$rc" -eq 0 ]; then
        stop_last_server 10
    else
        if [ "$rc" -eq 124 ]; then
            echo "$BENCH_NAME: $name: no result in $secs s: $*" >&2
        else
            echo "$BENCH_NAME: $name: client failed (status $rc): $*" >&2
        fi
        { echo "$PAIR_OUT"; cat "$LOGDIR/$name.client.log" "$LOGDIR/$name.log"; } | tail -20 >&2
        stop_last_server 0
    fi
    next_port
    [ "$rc" -eq 0 ]
}

# shellcheck disable=SC2034 # read by the scripts that source this file
UCX_MB=1.048576
ROUNDS=${ROUNDS:-9}
if ! [[ $ROUNDS =~ ^[0-9]+$ ]] || [ "$ROUNDS" -lt 1 ]; then
    die "ROUNDS=$ROUNDS: a number of rounds, 9 or more"
fi
if [ "$ROUNDS" -lt 9 ] && [ "${BENCH_FEW_ROUNDS:-0}" != 1 ]; then
    die "ROUNDS=$ROUNDS: at least 9 (the median of fewer paired rounds on these machines is" \
        "noise); BENCH_FEW_ROUNDS=1 runs it anyway, marked as a try-out"
fi
declare -A ROUND_FIGS

rounds_header() {
    if [ "$ROUNDS" -lt 9 ]; then
        echo "# TRY-OUT: $ROUNDS rounds, fewer than 9 - these figures are not a measurement"
    fi
    echo "# each figure: the median of $ROUNDS rounds, pairs alternating their order; its" \
         "range after it"
}

round_first() { (( $1 % 2 == 1 )); }

round_pair() {
    local runs=("$@") i
    if round_first "$round"; then
        for ((i = 0; i < ${#runs[@]}; i++)); do ${runs[$i]}; done
    else
        for ((i = ${#runs[@]} - 1; i >= 0; i--)); do ${runs[$i]}; done
    fi
}

round_add() {
    [[ $2 =~ ^[0-9.e+-]+$ ]] || die "could not read $1 (got '$2')"
    ROUND_FIGS[$1]+="$2 "
}

round_ratio() {
    local a b
    a=$(awk '{print $NF}' <<<"${ROUND_FIGS[$1]}")
    b=$(awk '{print $NF}' <<<"${ROUND_FIGS[$2]}")
    ROUND_FIGS[R_$1_$2]+="$(awk -v a="$a" -v b="$b" 'BEGIN {print (b > 0) ? a / b : 0}') "
}

round_median() {
    local sorted fmt=%.3f
    sorted=$(tr ' ' '\n' <<<"${ROUND_FIGS[$1]}" | grep . | sort -g)
    [ -n "$sorted" ] || die "no rounds of $1"
    printf -v "$1" '%s' "$(awk '{a[NR] = $1}
        END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}' <<<"$sorted")"
    [[ $1 == R_* ]] && fmt=%.2f
    printf -v "$1_RANGE" '%s' "$(awk -v f="$fmt" 'NR == 1 {lo = $1} {hi = $1}
        END {printf f "-" f, lo, hi}' <<<"$sorted")"
}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}

xfer_tcp() {
    local test=$1 size=$2 iters=$3
    shift 3
    run_pair "xfer_${test}_$size" "$RUN_TIMEOUT" "$PERF" -x tcp -p "$PORT" -- \
        "$PERF" -x tcp -t "$test" -s "$size" -n "$iters" --json "$@" -p "$PORT" 127.0.0.1
}

ucx_tcp() {
    local test=$1 size=$2 iters=$3
    shift 3
    run_pair "ucx_${test}_$size" "$RUN_TIMEOUT" \
        env UCX_TLS=tcp UCX_NET_DEVICES=lo ucx_perftest -p "$PORT" -- \
        env UCX_TLS=tcp UCX_NET_DEVICES=lo \
        ucx_perftest 127.0.0.1 -p "$PORT" -t "$test" -s "$size" -n "$iters" -f -v "$@" || return 1
    # the final line: "%4.0f,..." puts spaces before fewer than 1000 iterations
    PAIR_OUT=$(awk '/^ *[0-9]+,/ {v = $0} END {print v}' <<<"$PAIR_OUT")
    [ -n "$PAIR_OUT" ] && return 0
    echo "$BENCH_NAME: ucx_perftest -t $test -s $size printed no CSV line" >&2
    return 1
}

# shellcheck disable=SC2034 # OUT and BENCH_ARGS are read by the calling script
# The scale probe of build dir $1, in PROBE, and the tools the probe's scripts need.
need_scale_probe() {
    PROBE=$1/contrib/bench/scale_probe
    [ -x "$PROBE" ] || die "no $PROBE: build it first (make contrib/bench/scale_probe)"
    local tool
    for tool in jq ss taskset; do
        command -v "$tool" >/dev/null ||
            die "$tool not found (apt-get install jq iproute2 util-linux)"
    done
}

# One scale_probe pair (need_scale_probe first) over transport $1 with $2 endpoints, each
# side's command prefixed by the words of the array PROBE_ENV (may be empty): every FIELDS
# figure of its JSON goes into the rounds as ${1}_${3}_<field> and, with the round, into CSV
# as "$1,$round,$3,<figures>".
probe_pair() {
    local t=$1 n=$2 label=$3 f v line
    run_pair "${BENCH_NAME}_${t}_$label" "$RUN_TIMEOUT" \
        "${PROBE_ENV[@]}" taskset -c 1 "$PROBE" -x "$t" -n "$n" -p "$PORT" -- \
        "${PROBE_ENV[@]}" taskset -c 0 "$PROBE" -x "$t" -n "$n" -p "$PORT" 127.0.0.1 ||
        die "scale_probe -x $t -n $n ($label) failed"
    [ "$(jq -r .transport <<<"$PAIR_OUT")" = "$t" ] || die "the probe did not run over $t"
    line=$t,$round,$label
    for f in "${FIELDS[@]}"; do
        v=$(jq ".$f" <<<"$PAIR_OUT")
        round_add "${t}_${label}_$f" "$v"
        line+=,$v
    done
    echo "$line" >>"$CSV"
}

bench_out_args() {
    OUT=.
    while [ $# -gt 0 ]; do
        case $1 in
        --out) [ $# -ge 2 ] || die "--out needs a directory"
               OUT=$2; shift 2 ;;
        --out=*) OUT=${1#--out=}; shift ;;
        -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
        *) break ;;
        esac
    done
    BENCH_ARGS=("$@")
}

# shellcheck disable=SC2034 # read by the scripts that source this file
AWK_AIMS='
function aims_header() {
    printf "%-" aim_w "s %10s %10s %-5s %7s  %-8s %s\n", "aim", "a", "b", "unit", "ratio",
           "target", "verdict"
}
function aim(what, a, b, unit, op, bound, ratio, range,    r, ok) {
    if ((a + 0 <= 0) || (b + 0 <= 0)) {     # a figure that was not measured: no verdict
        printf "%-" aim_w "s %10.3f %10.3f %-5s %7s  %s %-5s %s\n", what, a, b, unit, "-", op,
               bound, "no figure"
        return
    }
    r = (ratio != "") ? ratio : a / b
    ok = (op == ">=") ? r >= bound : r <= bound
    # three places: a ratio a hair under its bound must not print as the bound itself
    printf "%-" aim_w "s %10.3f %10.3f %-5s %7.3f  %s %-5s %-7s %s\n", what, a, b, unit, r, op,
           bound, ok ? "met" : "NOT met", range
}'
