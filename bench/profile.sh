#!/usr/bin/env bash
# bench/profile.sh: instructions per RPC of the ledger server and of the gRPC floor, counted by
# valgrind's callgrind, so that a change to the claim path is measured by a figure that does
# not move with the machine's load (the same binary and workload count the same instructions
# within a few per cent; batch sizes, and so the count, still depend on timing at many clients).
#
# For each client count, each side runs under callgrind with collection off; ledger-bench runs
# a warm-up (not counted), then collection is switched on for exactly --count operations and the
# totals are read. Sides: the floor (target/release/ledger-floor, the same RPC shapes) and ours
# (target/release/idempotency-ledger on a throwaway PostgreSQL cluster, or on SQLite with
# --store sqlite). Prints instructions per RPC for each, ours above the floor, and the functions
# that count most (inclusive), and keeps the callgrind files for callgrind_annotate.
#
# Usage: bench/profile.sh [options]
#   --workload W        claim-complete (default) or replay
#   --clients "C ..."   client counts (default "1 32")
#   --count N           operations counted per cell (default 2000)
#   --store S           postgres (default) or sqlite
#   --out DIR           where the callgrind files and logs go (default bench/results/profile)
#   --no-build          use the binaries already in target/release
#   --bin-dir DIR       use the binaries in DIR (idempotency-ledger, ledger-floor, ledger-bench),
#                       e.g. a copy of an earlier build, to compare two builds; implies --no-build
#   --top N             functions listed per cell (default 25)
#
# Needs: valgrind (callgrind, callgrind_control, callgrind_annotate), and for --store postgres
# PostgreSQL's initdb, pg_ctl and postgres (on PATH or /usr/lib/postgresql/<major>/bin), run as
# the postgres user through setpriv when run as root.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

WORKLOAD=claim-complete
CLIENTS="1 32"
COUNT=2000
STORE=postgres
OUT=bench/results/profile
BUILD=1
TOP=25
BIN_DIR=""
while (($#)); do
    case $1 in
    --workload) WORKLOAD=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --count) COUNT=$2; shift 2 ;;
    --store) STORE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --bin-dir) BIN_DIR=$2; BUILD=0; shift 2 ;;
    --top) TOP=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "profile.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
case $WORKLOAD in claim-complete) RPCS=2 ;; replay) RPCS=1 ;; *) echo "profile.sh: workload claim-complete or replay" >&2; exit 2 ;; esac
case $STORE in postgres | sqlite) ;; *) echo "profile.sh: store postgres or sqlite" >&2; exit 2 ;; esac
for t in valgrind callgrind_control callgrind_annotate; do
    command -v "$t" >/dev/null || { echo "profile.sh: $t not found (Debian: valgrind)" >&2; exit 1; }
done

log() { echo "profile.sh: $*" >&2; }
if ((BUILD)); then
    log "building the release binaries"
    cargo build --release --locked --features bench --bins >&2
fi
REL=${BIN_DIR:-$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')/release}
SERVER=$REL/idempotency-ledger BENCH=$REL/ledger-bench FLOOR=$REL/ledger-floor
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
chmod 755 "$WORK"
PID="" PG_STARTED=0

as_pg() { if ((EUID == 0)); then setpriv --reuid=postgres --regid=postgres --init-groups "$@"; else "$@"; fi; }
cleanup() {
    local rc=$?
    [[ -n $PID ]] && { kill -TERM "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; }
    ((PG_STARTED)) && as_pg "$PG_BIN/pg_ctl" -D "$WORK/pg" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT

if [[ $STORE == postgres ]]; then
    PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n | tail -n1)}
    [[ -x $PG_BIN/initdb ]] || PG_BIN=$(dirname "$(command -v initdb)")
    PGPORT=$((20000 + RANDOM % 40000))
    ((EUID == 0)) && chown postgres "$WORK"
    as_pg "$PG_BIN/initdb" -D "$WORK/pg" -U postgres -A trust -E UTF8 --locale=C >"$WORK/initdb.log" 2>&1 ||
        { cat "$WORK/initdb.log" >&2; exit 1; }
    # The settings of bench/compare.sh: durable commits, the default shared_buffers.
    printf "listen_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\nmax_connections = 200\n" \
        "$PGPORT" "$WORK" >>"$WORK/pg/postgresql.conf"
    as_pg "$PG_BIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg.log" -w start >/dev/null
    PG_STARTED=1
    as_pg "$PG_BIN/psql" -X -q -h "$WORK" -p "$PGPORT" -U postgres -d postgres -c "CREATE DATABASE ledger"
    STORE_ARGS=(--database-url "postgres://postgres@127.0.0.1:$PGPORT/ledger")
    "$SERVER" migrate "${STORE_ARGS[@]}" >/dev/null 2>&1
fi

# start NAME PROGRAM ARGS...: the program under callgrind, collection off; sets PID and PORT.
start() {
    local name=$1
    shift
    RUST_LOG=info valgrind --tool=callgrind --instr-atstart=no --log-file="$OUT/$name.valgrind.log" \
        --callgrind-out-file="$OUT/$name.callgrind" "$@" --listen 127.0.0.1:0 2>"$OUT/$name.log" &
    PID=$!
    PORT=""
    for _ in $(seq 600); do
        PORT=$(sed -n 's/.*listen=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$OUT/$name.log" | head -n1)
        [[ -n $PORT ]] && return
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    log "$name did not start; see $OUT/$name.log"
    exit 1
}

# measure NAME CLIENTS BENCH_ARGS...: warm-up, then COUNT operations counted; sets IR to the
# instructions per RPC (not in a subshell: the program is this shell's child, to be waited for).
measure() {
    local name=$1 c=$2
    shift 2
    local bench=("$BENCH" --addr "http://127.0.0.1:$PORT" --clients "$c" --connect-timeout 120s "$@")
    "${bench[@]}" --warmup 0s --count $((c * 20 > 200 ? c * 20 : 200)) >"$OUT/$name.warmup.txt" 2>&1
    callgrind_control -i on "$PID" >/dev/null 2>&1
    "${bench[@]}" --warmup 0s --count "$COUNT" --json "$OUT/$name.json" >"$OUT/$name.bench.txt" 2>&1
    callgrind_control -i off "$PID" >/dev/null 2>&1
    kill -TERM "$PID"
    wait "$PID" || true
    PID=""
    local ir
    ir=$(callgrind_annotate "$OUT/$name.callgrind" 2>/dev/null | sed -n 's/^\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,)
    [[ -n $ir ]] || { log "no totals in $OUT/$name.callgrind"; exit 1; }
    IR=$((ir / (COUNT * RPCS)))
}

declare -A FLOOR_IR OURS_IR
for c in $CLIENTS; do
    log "floor, $c clients"
    start "floor-$WORKLOAD-$c" "$FLOOR"
    measure "floor-$WORKLOAD-$c" "$c" --workload floor --floor-of "$WORKLOAD"
    FLOOR_IR[$c]=$IR
    log "ours ($STORE), $c clients"
    if [[ $STORE == sqlite ]]; then
        rm -f "$WORK"/ledger.db*
        start "ours-$WORKLOAD-$c" "$SERVER" --database-url "sqlite://$WORK/ledger.db"
    else
        as_pg "$PG_BIN/psql" -X -q -h "$WORK" -p "$PGPORT" -U postgres -d ledger -c "TRUNCATE ledger_entries" -c CHECKPOINT
        start "ours-$WORKLOAD-$c" "$SERVER" "${STORE_ARGS[@]}"
    fi
    measure "ours-$WORKLOAD-$c" "$c" --workload "$WORKLOAD"
    OURS_IR[$c]=$IR
done

echo
echo "Instructions per RPC (callgrind, $COUNT operations of $WORKLOAD, $RPCS RPC each; store $STORE)"
echo
echo "| clients | floor | ours | ours above the floor |"
echo "| ---: | ---: | ---: | ---: |"
for c in $CLIENTS; do
    echo "| $c | ${FLOOR_IR[$c]} | ${OURS_IR[$c]} | $((OURS_IR[$c] - FLOOR_IR[$c])) |"
done
for c in $CLIENTS; do
    echo
    echo "Ours at $c clients, the functions that count most (inclusive instructions):"
    callgrind_annotate --inclusive=yes "$OUT/ours-$WORKLOAD-$c.callgrind" 2>/dev/null |
        grep -E '^ *[0-9,]+ \(' | sed -n "2,$((TOP + 1))p"
done
echo
echo "callgrind files: $OUT (callgrind_annotate --inclusive=yes FILE)"
