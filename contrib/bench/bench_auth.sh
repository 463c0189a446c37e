#!/usr/bin/env bash
# bench_auth.sh [--out DIR] BUILD: what the bootstrap's authentication (XFER_AUTH_KEY_FILE)
# costs. For each transport, scale_probe (built in BUILD) connects AUTH_ENDPOINTS endpoints
# from one client process to one server process in one burst (both pinned, the server to
# core 1 and the client to core 0), once without a key and once with one, and measures:
#   connect   the burst's time per endpoint (us): the handshake, where the key is proven
#   rt_poll   the 8-byte round trip of one pair afterwards (us): the data path, which the key
#             must not touch
# Each figure is the median of ROUNDS rounds (plain and keyed in alternating order), with its
# range, and the keyed one as a ratio to the plain one within each round.
# The table goes to stdout and DIR/auth.txt, every run to DIR/auth.csv.
#
# Knobs: ROUNDS (9, at least 9; lib.sh), AUTH_ENDPOINTS (64), AUTH_TRANSPORTS ("tcp shm"),
# BENCH_PORT (19900), RUN_TIMEOUT (300). Needs jq, ss (iproute2) and taskset (util-linux).
# A tool, not a test: it exits 0 whatever the figures.
set -euo pipefail

# shellcheck disable=SC2034 # read by lib.sh
BENCH_NAME=bench_auth
# shellcheck source=contrib/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bench_out_args "$@"
set -- "${BENCH_ARGS[@]}"
[ $# -eq 1 ] || die "usage: bench_auth.sh [--out DIR] BUILD"
need_scale_probe "$1"
N=${AUTH_ENDPOINTS:-64}
read -r -a TRANSPORTS <<<"${AUTH_TRANSPORTS:-tcp shm}"
PORT=${BENCH_PORT:-19900}
FIELDS=(connect_us_per_ep rt_poll_us)
mkdir -p "$OUT"
CSV=$OUT/auth.csv
echo "transport,round,mode,$(IFS=,; echo "${FIELDS[*]}")" >"$CSV"
export XFER_COMPONENT_PATH=$1/components
KEY=$(mktemp)
trap 'rm -f "$KEY"' EXIT
head -c 32 /dev/urandom >"$KEY"
chmod 600 "$KEY"

probe() {
    local t=$1 mode=$2
    if [ "$mode" = keyed ]; then
        PROBE_ENV=(env "XFER_AUTH_KEY_FILE=$KEY")
    else
        PROBE_ENV=(env -u XFER_AUTH_KEY_FILE)
    fi
    probe_pair "$t" "$N" "$mode"
}

echo "# bench_auth: $PROBE; $(nproc) cores; $ROUNDS rounds; $N endpoints a burst" >&2
for ((round = 1; round <= ROUNDS; round++)); do
    echo "# round $round of $ROUNDS" >&2
    for t in "${TRANSPORTS[@]}"; do
        round_pair "probe $t plain" "probe $t keyed"
        for f in "${FIELDS[@]}"; do
            round_ratio "${t}_keyed_$f" "${t}_plain_$f"
        done
    done
done

{
    rounds_header
    printf '%-5s %-6s %24s %10s %22s %10s\n' transport mode "connect us/ep" "x plain" \
        "rt_poll us" "x plain"
    for t in "${TRANSPORTS[@]}"; do
        for mode in plain keyed; do
            cells=()
            for f in "${FIELDS[@]}"; do
                round_median "${t}_${mode}_$f"
                m=${t}_${mode}_$f
                r=${m}_RANGE
                printf -v v '%.2f (%s)' "${!m}" "${!r}"
                cells+=("$v")
                if [ "$mode" = keyed ]; then
                    round_median "R_${t}_keyed_${f}_${t}_plain_$f"
                    m=R_${t}_keyed_${f}_${t}_plain_$f
                    printf -v v '%.2f' "${!m}"
                    cells+=("$v")
                else
                    cells+=("-")
                fi
            done
            printf '%-5s %-6s %24s %10s %22s %10s\n' "$t" "$mode" "${cells[0]}" "${cells[1]}" \
                "${cells[2]}" "${cells[3]}"
        done
    done
} >"$OUT/auth.txt"
cat "$OUT/auth.txt"
