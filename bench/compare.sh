#!/usr/bin/env bash
# bench/compare.sh: the ledger server against hand-written SQL on the same PostgreSQL, in one run.
#
# Builds the release binaries, starts a throwaway PostgreSQL cluster, and for each workload and
# client count measures
#   - the baseline: pgbench running exactly the SQL the server issues per operation
#     (bench/pgbench/*.sql), as autocommit statements over C connections,
#   - the gRPC floor: target/release/ledger-floor, a server on the same tonic stack and
#     settings that does no work, driven by ledger-bench with the same clients making the same
#     RPCs (their number and sizes), and
#   - ours: target/release/idempotency-ledger on the same database, driven over gRPC by
#     target/release/ledger-bench with C clients;
# then claim-complete with --mux-clients clients over --mux-connections HTTP/2 connections
# (as an agent runtime's channel pool connects) beside one connection per client, pgbench and
# the server both through PgBouncer in transaction mode (--pooler-clients, 32) beside the
# direct cells, the SQLite store through the server, and (with --scale) a 5M-row table. Prints
# the side-by-side tables and writes them to bench/results/latest.md (+ .json, + .png:
# throughput and latency against clients); --smoke writes bench/results/smoke.* instead, so CI
# never overwrites the committed record, and --results BASE writes BASE.* (a partial run).
#
# Usage: bench/compare.sh [options]
#   --smoke                 a few hundred operations per cell, client counts 1 and 8 and the
#                           --mux-clients cell (CI)
#   --scale                 also load 5M finished entries and compare claim-complete and lookup
#                           on the empty and the loaded table (off by default, off in --smoke)
#   --scale-rows N          rows --scale loads (default 5000000)
#   --duration SECS         measured seconds per cell (default 10)
#   --warmup SECS           unmeasured seconds before each cell (default 1)
#   --rounds N              run every cell N times, alternating the sides, and report each
#                           side's median round by throughput (default 1)
#   --clients "C ..."       client counts for PostgreSQL (default "1 8 32 64")
#   --mux-clients N         the multiplexed cell: claim-complete with N clients, measured both
#                           over --mux-connections connections and with one connection per
#                           client (default 256; 0: no such cell)
#   --mux-connections K     HTTP/2 connections the --mux-clients clients share, each a tonic
#                           Channel carrying N/K concurrent clients (default 8)
#   --pooler-clients "C ..."  client counts of the pooler cells: pgbench (-M extended) and the
#                           server (--postgres-pooler transaction) through PgBouncer in
#                           transaction mode, beside the direct cells (default "32"; --smoke:
#                           8; "": none)
#   --pooler-workloads "W ..."  workloads of the pooler cells (default "claim-complete replay")
#   --no-pooler             no pooler cells (the same as --pooler-clients ""); then PgBouncer
#                           is not needed
#   --sqlite-clients "C ..."  client counts for the SQLite store (default "1 32")
#   --db-max-connections default|match|N
#                           the server's PostgreSQL pool: default (the server's own default,
#                           16, as deployed), match (C + 1 in a cell of C clients: as many
#                           connections for requests as pgbench has, plus the one the server's
#                           LISTEN keeps), or N
#   --results BASE          write BASE.md, BASE.json and BASE.png (default bench/results/latest;
#                           --smoke: bench/results/smoke)
#   --no-build              use the binaries already in target/release
#   --no-plot               draw no picture (then gnuplot is not needed)
#   --keep                  keep the temp dir (cluster, logs, raw outputs) and print its path
#   -h, --help
#
# Needs: cargo, PostgreSQL's server programs (initdb, pg_ctl, postgres; found on PATH or under
# /usr/lib/postgresql/<major>/bin, or set PG_BIN), psql and pgbench, setpriv (util-linux)
# when run as root, since PostgreSQL refuses to run as root: it then runs as the `postgres` user
# (as does PgBouncer), PgBouncer (Debian's pgbouncer: /usr/sbin/pgbouncer, or set PGBOUNCER)
# unless --no-pooler, and gnuplot (Debian's gnuplot-nox) unless --no-plot.
# Exits non-zero if any cell had an error.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

DURATION=10
WARMUP=1
ROUNDS=1
ROUND=1
CLIENTS="1 8 32 64"
SQLITE_CLIENTS="1 32"
MUX_CLIENTS=256
MUX_CONNECTIONS=8
POOLER_CLIENTS="32"
POOLER_WORKLOADS="claim-complete replay"
PLOT=1
POOL=default
SMOKE=0
SCALE=0
SCALE_ROWS=5000000
SCALE_CLIENTS=32
BUILD=1
KEEP=0
RESULT_BASE=""
SMOKE_OPS=300          # operations per cell in --smoke
HOT_KEYS=100           # the replay workload's hot set
LOOKUP_KEYS=1000       # --scale: entries the empty-table lookup reads

usage() { sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

while (($#)); do
    case $1 in
        --smoke) SMOKE=1 ;;
        --scale) SCALE=1 ;;
        --scale-rows) SCALE_ROWS=$2; shift ;;
        --duration) DURATION=$2; shift ;;
        --warmup) WARMUP=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        --clients) CLIENTS=$2; shift ;;
        --mux-clients) MUX_CLIENTS=$2; shift ;;
        --mux-connections) MUX_CONNECTIONS=$2; shift ;;
        --pooler-clients) POOLER_CLIENTS=$2; shift ;;
        --pooler-workloads) POOLER_WORKLOADS=$2; shift ;;
        --no-pooler) POOLER_CLIENTS="" ;;
        --no-plot) PLOT=0 ;;
        --sqlite-clients) SQLITE_CLIENTS=$2; shift ;;
        --db-max-connections) POOL=$2; shift ;;
        --results) RESULT_BASE=$2; shift ;;
        --no-build) BUILD=0 ;;
        --keep) KEEP=1 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if ((SMOKE)); then
    CLIENTS="1 8"
    SQLITE_CLIENTS="1 8"
    [[ -z $POOLER_CLIENTS ]] || POOLER_CLIENTS="8"
    SCALE=0
    RESULT_BASE=${RESULT_BASE:-bench/results/smoke}
else
    RESULT_BASE=${RESULT_BASE:-bench/results/latest}
fi
# mixed-wait runs once, at the largest client count from 8 to 32 (with one client nobody waits).
WAIT_CLIENTS=""
for c in $CLIENTS; do
    if ((c >= 8 && c <= 32)); then WAIT_CLIENTS=$c; fi
done

log() { printf '[compare %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ $MUX_CLIENTS =~ ^[0-9]+$ && $MUX_CONNECTIONS =~ ^[1-9][0-9]*$ ]] ||
    die "--mux-clients takes a count (0: none) and --mux-connections a positive count"
((MUX_CLIENTS == 0 || MUX_CONNECTIONS < MUX_CLIENTS)) ||
    die "--mux-connections ($MUX_CONNECTIONS) must be fewer than --mux-clients ($MUX_CLIENTS)"
if ((PLOT)) && ! command -v gnuplot >/dev/null; then
    die "gnuplot not found (Debian: apt-get install gnuplot-nox), or pass --no-plot"
fi
for w in $POOLER_WORKLOADS; do
    [[ $w == claim-complete || $w == replay ]] ||
        die "--pooler-workloads takes claim-complete and/or replay, not $w"
done
[[ -n $POOLER_WORKLOADS ]] || POOLER_CLIENTS=""
if [[ -n $POOLER_CLIENTS ]]; then
    if [[ -z ${PGBOUNCER:-} ]]; then
        for p in /usr/sbin/pgbouncer /usr/bin/pgbouncer "$(command -v pgbouncer || true)"; do
            if [[ -n $p && -x $p ]]; then PGBOUNCER=$p; break; fi
        done
    fi
    [[ -n ${PGBOUNCER:-} && -x $PGBOUNCER ]] ||
        die "pgbouncer not found (Debian: apt-get install pgbouncer; or set PGBOUNCER), or pass --no-pooler"
    POOLER_VERSION=$("$PGBOUNCER" --version 2>/dev/null | head -n1)
fi
# The most clients pgbench opens at once, for PostgreSQL's max_connections.
MAX_CLIENTS=$MUX_CLIENTS
for c in $CLIENTS; do if ((c > MAX_CLIENTS)); then MAX_CLIENTS=$c; fi; done

# ---- build ------------------------------------------------------------------------------------
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if ((BUILD)); then
    log "building release binaries"
    cargo build --release --bins --features bench --quiet
fi
SERVER=$TARGET_DIR/release/idempotency-ledger
BENCH=$TARGET_DIR/release/ledger-bench
FLOOR=$TARGET_DIR/release/ledger-floor
[[ -x $SERVER && -x $BENCH && -x $FLOOR ]] || die "no release binaries in $TARGET_DIR/release"

# ---- temp dir and cleanup --------------------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ledger-compare.XXXXXX")
chmod 0711 "$WORK" # the cluster's directory below belongs to the postgres user when we are root
mkdir -p "$WORK/logs" "$WORK/json" "$WORK/pgbench"
SERVER_PID=""
POOLER_PID=""
PG_STARTED=0
FAILED_CELLS=()

cleanup() {
    local rc=$?
    if [[ -n $SERVER_PID ]]; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    if [[ -n $POOLER_PID ]]; then
        kill -TERM "$POOLER_PID" 2>/dev/null || true
        wait "$POOLER_PID" 2>/dev/null || true
    fi
    if ((PG_STARTED)); then
        as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    if ((KEEP)); then log "kept $WORK"; else rm -rf "$WORK"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- PostgreSQL ------------------------------------------------------------------------------
if [[ -z ${PG_BIN:-} ]]; then
    PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n | tail -n1 || true)
    if [[ -z $PG_BIN || ! -x $PG_BIN/pg_ctl ]]; then
        command -v pg_ctl >/dev/null || die "PostgreSQL's pg_ctl not found (set PG_BIN)"
        PG_BIN=$(dirname "$(readlink -f "$(command -v pg_ctl)")")
    fi
fi
tool() { if [[ -x $PG_BIN/$1 ]]; then echo "$PG_BIN/$1"; else command -v "$1" || die "$1 not found"; fi; }
PGBENCH=$(tool pgbench) && PSQL_BIN=$(tool psql) || exit 1

as_pg() {
    if ((EUID == 0)); then
        setpriv --reuid=postgres --regid=postgres --init-groups "$@"
    else
        "$@"
    fi
}

free_port() {
    local p
    for _ in $(seq 50); do
        p=$((20000 + RANDOM % 40000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    die "no free port found"
}

PGDIR=$WORK/pg
PGDATA=$PGDIR/data
PG_MAX_CONNECTIONS=$((MAX_CLIENTS + 40 > 200 ? MAX_CLIENTS + 40 : 200))
mkdir -p "$PGDIR"
((EUID == 0)) && chown postgres:postgres "$PGDIR"
log "initdb ($("$PG_BIN/postgres" --version))"
as_pg "$PG_BIN/initdb" -D "$PGDATA" -U postgres -A trust -E UTF8 --locale=C --no-instructions \
    >"$WORK/logs/initdb.log" 2>&1 || { cat "$WORK/logs/initdb.log" >&2; die "initdb failed"; }
# The settings of both sides: pgbench and the server run against this one cluster, one after
# the other. Durable commits as in production (fsync and synchronous_commit on, the defaults),
# room for the most pgbench connections of any cell (at least 200) plus the server's pool, and
# shared_buffers 128MB (the default, stated so a changed default does not change the figures).
cat >>"$PGDATA/postgresql.conf" <<EOF

# ---- bench/compare.sh ----
listen_addresses = '127.0.0.1'
unix_socket_directories = '$PGDIR'
max_connections = $PG_MAX_CONNECTIONS
shared_buffers = 128MB
fsync = on
synchronous_commit = on
full_page_writes = on
include_if_exists = 'compare-port.conf'
EOF
for attempt in 1 2 3 4 5; do
    PGPORT=$(free_port)
    echo "port = $PGPORT" | as_pg tee "$PGDATA/compare-port.conf" >/dev/null
    if as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" -l "$PGDIR/server.log" -w -t 60 start >/dev/null; then
        PG_STARTED=1
        break
    fi
    ((attempt < 5)) || { tail -20 "$PGDIR/server.log" >&2; die "PostgreSQL did not start"; }
done
PSQL=("$PSQL_BIN" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PGPORT" -U postgres)
PM_PID=$(head -n1 "$PGDATA/postmaster.pid")
"${PSQL[@]}" -d postgres -c "CREATE DATABASE ledger"
DB_URL="postgres://postgres@127.0.0.1:$PGPORT/ledger"
"$SERVER" migrate --database-url "$DB_URL" 2>"$WORK/logs/migrate.log" ||
    { cat "$WORK/logs/migrate.log" >&2; die "migrations failed"; }
log "PostgreSQL on port $PGPORT, migrated"

# ---- PgBouncer (the pooler cells) ------------------------------------------------------------
# The server's PostgreSQL pool in a cell of C clients (--db-max-connections), as a number: the
# default is the server's own (src/defaults.rs).
DEFAULT_POOL=$(sed -n 's/^pub const DB_MAX_CONNECTIONS: u32 = \([0-9]*\);.*/\1/p' src/defaults.rs)
DEFAULT_POOL=${DEFAULT_POOL:-16}
pool_size() {
    case $POOL in
        default) echo "$DEFAULT_POOL" ;;
        match) echo $(($1 + 1)) ;;
        *) echo "$POOL" ;;
    esac
}

# start_pooler POOL_SIZE C NAME: a fresh PgBouncer in transaction mode in front of the cluster,
# with POOL_SIZE server connections (default_pool_size; the database sees no more) for up to
# C + 50 clients; sets POOLER_PID and POOLER_PORT. The configuration is the tests' (see
# tests/api/support/pgbouncer.rs: trust, as the cluster, with the user in auth_file), with the
# pool's size, the client limit, and extra_float_digits ignored (a startup parameter PgBouncer
# refuses unless told to ignore it; sqlx sends it by default, the ledger's connections turn it
# off, src/storage/postgres.rs, and pgbench does not send it: set for any sqlx client).
start_pooler() {
    local size=$1 c=$2 dir=$WORK/pgbouncer/$3 attempt run=("$PGBOUNCER")
    mkdir -p "$dir"
    ((EUID == 0)) && chown postgres:postgres "$dir" &&
        run=(setpriv --reuid=postgres --regid=postgres --init-groups "$PGBOUNCER")
    echo '"postgres" ""' >"$dir/users.txt"
    for attempt in 1 2 3 4 5; do
        POOLER_PORT=$(free_port)
        cat >"$dir/pgbouncer.ini" <<INI
[databases]
ledger = host=127.0.0.1 port=$PGPORT dbname=ledger

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $POOLER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $dir/users.txt
pool_mode = transaction
default_pool_size = $size
max_client_conn = $((c + 50))
ignore_startup_parameters = extra_float_digits
INI
        # It logs to stderr.
        "${run[@]}" "$dir/pgbouncer.ini" >/dev/null 2>>"$dir/pgbouncer.log" &
        POOLER_PID=$!
        for _ in $(seq 200); do
            if (exec 3<>"/dev/tcp/127.0.0.1/$POOLER_PORT") 2>/dev/null; then return 0; fi
            kill -0 "$POOLER_PID" 2>/dev/null || break
            sleep 0.05
        done
        stop_pooler
    done
    tail -5 "$dir/pgbouncer.log" >&2 || true
    die "PgBouncer did not start; see $dir"
}

stop_pooler() {
    if [[ -n $POOLER_PID ]]; then
        kill -TERM "$POOLER_PID" 2>/dev/null || true # SIGTERM: PgBouncer's immediate shutdown
        wait "$POOLER_PID" 2>/dev/null || true
        POOLER_PID=""
    fi
}

# CPU clock ticks (user + system) used so far by one process (PgBouncer: one process).
pid_cpu_ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null || echo 0; }

# ---- the values both sides store ------------------------------------------------------------
TENANT=default
TOOL=issue_credit
# What ledger-bench's Complete stores, byte for byte (src/bin/ledger-bench.rs RESULT).
# What the server keeps of ledger-bench's arguments for audit: their canonical form (nothing
# in them is redacted).
ARGUMENTS='{"amount":200,"currency":"EUR","customer":"c-42"}'
RESULT='{"credit_id":"cr-7f3a9c2e41","status":"issued","amount":200,"currency":"EUR","ref":"L-2026-0000042"}'
# The fingerprint the server derives for ledger-bench's tool and arguments.
FINGERPRINT=d839cebaba2b8c0d6298b424549d4127ede041d1d4d491f0fe62163d1f55f51e
LEASE_US=60000000           # the server's default lease, 60 s
RETENTION_US=86400000000    # the server's default retention, 24 h
RUN_TAG=r$(date +%s)

pgbench_defs() {
    printf -- '-D\n%s\n' "tenant=$TENANT" "tool=$TOOL" "fingerprint=$FINGERPRINT" \
        "attempting=ATTEMPTING" "succeeded=SUCCEEDED" "also_unknown=false" "lease_us=$LEASE_US" \
        "retention_us=$RETENTION_US" "result=$RESULT" "arguments=$ARGUMENTS" "run_tag=$RUN_TAG-$1" \
        "run_id=bench-pgbench-$RUN_TAG-$1" "hot_keys=$HOT_KEYS"
}

# A fresh table for every cell, and a checkpoint, so each starts from the same state.
reset_table() { "${PSQL[@]}" -d ledger -c "TRUNCATE ledger_entries" -c "CHECKPOINT"; }

# json_get FILE a.b: a value of the pretty-printed JSON ledger-bench writes (null when absent).
json_get() {
    awk -v want="$2" '
        { line = $0; sub(/^[ \t]+/, "", line) }
        line ~ /^[}\]],?$/ { depth--; next }
        match(line, /^"[^"]*": /) {
            key = substr(line, 2, RLENGTH - 4); val = substr(line, RLENGTH + 1)
            if (val == "{" || val == "[") { path[++depth] = key; next }
            sub(/,$/, "", val); gsub(/^"|"$/, "", val)
            full = key; for (i = depth; i >= 1; i--) full = path[i] "." full
            if (full == want) { print val; found = 1; exit }
        }
        END { if (!found) print "null" }' "$1"
}

fmt() { [[ $1 == null || -z $1 ]] && echo "-" || printf "%.${2:-2}f" "$1"; }

# Percentiles (ms) of pgbench's per-transaction log (3rd field: latency in µs).
log_percentiles() {
    cat "$@" 2>/dev/null | awk '$3 ~ /^[0-9]+$/ { print $3 }' | sort -n | awk '
        { v[NR] = $1 }
        END {
            if (NR == 0) { print "null null"; exit }
            i50 = int(NR * 0.50); if (i50 < 1) i50 = 1
            i99 = int(NR * 0.99); if (i99 < 1) i99 = 1
            printf "%.3f %.3f\n", v[i50] / 1000, v[i99] / 1000
        }'
}

# CPU clock ticks (1/100 s) used so far by the postmaster and its children (the backends,
# live or reaped), as ledger-bench --db-pid counts them.
db_cpu_ticks() {
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v pm="$PM_PID" '
        { rest = $0; sub(/^.*\) /, "", rest); split(rest, f, " ") # f[1] is field 3 (state)
          if ($1 == pm) t += f[12] + f[13] + f[14] + f[15]; else if (f[2] == pm) t += f[12] + f[13] }
        END { print t + 0 }'
}
# CPU ticks of this shell's reaped children, pgbench among them (cutime + cstime).
children_cpu_ticks() { awk '{ sub(/^.*\) /, ""); print $14 + $15 }' "/proc/$$/stat"; }
per_op() { awk -v t="$1" -v n="$2" 'BEGIN { if (n > 0) printf "%.3f", t * 10 / n; else print "null" }'; }

CELLS_JSON=()
ROWS=()
CPU_ROWS=()
FLOOR_ROWS=()
PLOT_ROWS=()

# pgbench_cell WORKLOAD C [VIA]: fills PGB_* for the row that ours_cell then completes. VIA
# pgbouncer: through a fresh PgBouncer (start_pooler) of the server's pool size, with
# `-M extended` (unnamed statements: a transaction pooler keeps no prepared statement for the
# next transaction), instead of straight to PostgreSQL with `-M prepared`.
pgbench_cell() {
    local workload=$1 c=$2 via=${3:-postgres} name="pg-$1-c$2-r$ROUND" port=$PGPORT mode=prepared
    [[ $via == pgbouncer ]] && name="pg-pgbouncer-$1-c$2-r$ROUND"
    local script="bench/pgbench/${workload//-/_}.sql"
    local threads=$((c < 2 ? c : 2))
    local defs
    mapfile -t defs < <(pgbench_defs "$name")
    reset_table
    if [[ $workload == replay ]]; then
        "${PSQL[@]}" -d ledger -v tenant="$TENANT" -v run_tag="$RUN_TAG-$name" \
            -v hot_keys="$HOT_KEYS" -v tool="$TOOL" -v fingerprint="$FINGERPRINT" \
            -v result="$RESULT" -v retention_us="$RETENTION_US" -f bench/pgbench/hot_set.sql
    fi
    if [[ $via == pgbouncer ]]; then
        start_pooler "$(pool_size "$c")" "$c" "$name"
        port=$POOLER_PORT mode=extended
    fi
    local common=(-h 127.0.0.1 -p "$port" -U postgres -n -M "$mode" -c "$c" -j "$threads"
        -f "$script" "${defs[@]}")
    local run
    if ((SMOKE)); then
        run=(-t $(((SMOKE_OPS + c - 1) / c)))
    else
        "$PGBENCH" "${common[@]}" -T "$WARMUP" ledger >/dev/null 2>&1 || true
        run=(-T "$DURATION")
    fi
    local out=$WORK/pgbench/out-$name.txt rc=0
    log "pgbench $workload, $c clients$([[ $via == pgbouncer ]] && echo " through PgBouncer (pool $(pool_size "$c"))")"
    local db0 cl0 db1 cl1 pb0=0 pb1=0
    [[ -z $POOLER_PID ]] || pb0=$(pid_cpu_ticks "$POOLER_PID")
    db0=$(db_cpu_ticks) cl0=$(children_cpu_ticks)
    "$PGBENCH" "${common[@]}" "${run[@]}" -r -l --log-prefix="$WORK/pgbench/log-$name" ledger \
        >"$out" 2>&1 || rc=$?
    sleep 0.2 # the postmaster reaps the backends, adding their CPU time to its children's
    db1=$(db_cpu_ticks) cl1=$(children_cpu_ticks)
    [[ -z $POOLER_PID ]] || pb1=$(pid_cpu_ticks "$POOLER_PID")
    stop_pooler
    PGB_TPS=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$out")
    PGB_AVG=$(sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p' "$out")
    PGB_DONE=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$out")
    PGB_FAILED=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$out")
    read -r PGB_P50 PGB_P99 < <(log_percentiles "$WORK/pgbench/log-$name".*)
    PGB_DB_CPU=$(per_op $((db1 - db0)) "${PGB_DONE:-0}")
    PGB_CLIENT_CPU=$(per_op $((cl1 - cl0)) "${PGB_DONE:-0}")
    PGB_POOLER_CPU=null
    [[ $via == pgbouncer ]] && PGB_POOLER_CPU=$(per_op $((pb1 - pb0)) "${PGB_DONE:-0}")
    PGB_ERR=0
    if ((rc != 0)) || [[ -z $PGB_TPS || ${PGB_FAILED:-0} != 0 || ${PGB_DONE:-0} == 0 ]]; then
        PGB_ERR=1
        FAILED_CELLS+=("$name")
        log "pgbench $name failed (exit $rc):"
        tail -15 "$out" >&2
    fi
    # Per-statement average latencies (-r), for "where the time goes".
    local statements
    statements=$(awk '/^statement latencies/ { on = 1; next }
        on && $1 ~ /^[0-9.]+$/ {
            first = 2; while (first <= NF && $first ~ /^[0-9.]+$/) first++  # failures (PG 15+)
            if ($first ~ /^\\/) next                                        # \set lines
            text = ""; for (i = first; i <= NF && i < first + 6; i++) text = text (i > first ? " " : "") $i
            gsub(/"/, "\\\"", text)
            printf "%s{\"avg_ms\": %s, \"statement\": \"%s\"}", (n++ ? ", " : ""), $1, text
        }' "$out")
    PGB_JSON=$(printf '{"via": "%s", "query_mode": "%s", "tps": %s, "latency_avg_ms": %s, "p50_ms": %s, "p99_ms": %s, "transactions": %s, "failed": %s, "exit": %s, "db_cpu_ms_per_op": %s, "pooler_cpu_ms_per_op": %s, "pgbench_cpu_ms_per_op": %s, "statements": [%s]}' \
        "$via" "$mode" "${PGB_TPS:-null}" "${PGB_AVG:-null}" "$PGB_P50" "$PGB_P99" \
        "${PGB_DONE:-null}" "${PGB_FAILED:-null}" "$rc" "$PGB_DB_CPU" "$PGB_POOLER_CPU" \
        "$PGB_CLIENT_CPU" "$statements")
}

# start_server LOGNAME PROGRAM ARGS...: starts the ledger server or the floor on a port the
# kernel picks and sets SERVER_PID and SERVER_PORT.
start_server() {
    local logname=$1
    shift
    # Port 0: the kernel picks a free port and the start-up log names it (a port probed free
    # beforehand can be taken by an ephemeral client port before the server binds it).
    RUST_LOG=info "$@" --listen "127.0.0.1:0" 2>"$WORK/logs/$logname.log" &
    SERVER_PID=$!
    SERVER_PORT=""
    for _ in $(seq 300); do
        SERVER_PORT=$(sed -n 's/.*listen=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/logs/$logname.log" | head -n 1)
        [[ -n $SERVER_PORT ]] && break
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    [[ -n $SERVER_PORT ]] || die "$(basename "$1") did not start; see $WORK/logs/$logname.log"
}

stop_server() {
    if [[ -n $SERVER_PID ]]; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}

# conns_name C CONNS: how many connections C clients use (CONNS 0: one per client).
conns_name() { if (($2 == 0)); then echo "$1"; else echo "$2"; fi; }

# run_bench NAME ERRVAR LOGNAME ARGS...: ledger-bench against the started server, with the
# measuring mode of this run; writes $WORK/json/NAME.json and sets ERRVAR to 0 or 1.
run_bench() {
    local name=$1 errvar=$2 logname=$3 rc=0 json=$WORK/json/$1.json run
    shift 3
    if ((SMOKE)); then run=(--count "$SMOKE_OPS" --warmup 0s); else
        run=(--duration "${DURATION}s" --warmup "${WARMUP}s"); fi
    "$BENCH" --addr "http://127.0.0.1:$SERVER_PORT" "${run[@]}" --server-pid "$SERVER_PID" \
        --json "$json" "$@" >"$WORK/logs/$name.out" 2>&1 || rc=$?
    stop_server
    printf -v "$errvar" 0
    if ((rc != 0)) || [[ ! -s $json ]] || [[ $(json_get "$json" failed_ops) != 0 ]]; then
        printf -v "$errvar" 1
        FAILED_CELLS+=("$name")
        log "ledger-bench $name failed (exit $rc):"
        tail -15 "$WORK/logs/$name.out" >&2
        tail -5 "$WORK/logs/$logname.log" >&2
        [[ -s $json ]] || echo '{}' >"$json"
    fi
}

# floor_cell SHAPE C CONNS: the floor standing in for workload SHAPE with C clients over CONNS
# connections; fills FLOOR_JSON_FILE and FLOOR_ERR. A cell already measured in this round (the
# SQLite cells reuse PostgreSQL's) is not measured again.
floor_cell() {
    local shape=$1 c=$2 conns=$3
    local name="floor-$shape-c$c-n$(conns_name "$c" "$conns")-r$ROUND"
    FLOOR_JSON_FILE=$WORK/json/$name.json
    if [[ -s $FLOOR_JSON_FILE ]]; then
        FLOOR_ERR=$(cat "$WORK/json/$name.err")
        return
    fi
    start_server "$name" "$FLOOR"
    log "ledger-bench floor ($shape), $c clients over $(conns_name "$c" "$conns") connections"
    run_bench "$name" FLOOR_ERR "$name" --workload floor --floor-of "$shape" --clients "$c" \
        --connections "$conns" --label "floor of $shape"
    echo "$FLOOR_ERR" >"$WORK/json/$name.err"
}

# ours_cell STORE WORKLOAD C CONNS [extra ledger-bench args...]: fills OURS_JSON_FILE and
# OURS_ERR. STORE postgres, pgbouncer (PostgreSQL through a fresh PgBouncer of the server's pool
# size, the server with --postgres-pooler transaction, migrations checked directly) or sqlite.
ours_cell() {
    local store=$1 workload=$2 c=$3 conns=$4
    local name="ours-$1-$2-c$3-n$(conns_name "$c" "$conns")-r$ROUND"
    shift 4
    local url pool pool_args=() db_pid=() pooler_args=()
    if [[ $store == postgres || $store == pgbouncer ]]; then
        url=$DB_URL
        db_pid=(--db-pid "$PM_PID")
        case $POOL in
            default) pool=default ;;
            match) pool=$((c + 1)) ;;
            *) pool=$POOL ;;
        esac
        [[ ${KEEP_TABLE:-0} == 1 ]] || reset_table
        if [[ $store == pgbouncer ]]; then
            start_pooler "$(pool_size "$c")" "$c" "$name"
            url="postgres://postgres@127.0.0.1:$POOLER_PORT/ledger"
            pooler_args=(--postgres-pooler transaction --migrations-database-url "$DB_URL")
            db_pid+=(--pooler-pid "$POOLER_PID")
        fi
    else
        rm -f "$WORK"/sqlite.db*
        url="sqlite://$WORK/sqlite.db"
        pool=default # SQLite has one writer whatever the pool
    fi
    [[ $pool == default ]] || pool_args=(--db-max-connections "$pool")
    start_server "$name" "$SERVER" --database-url "$url" "${pool_args[@]}" "${pooler_args[@]}"
    OURS_JSON_FILE=$WORK/json/$name.json
    log "ledger-bench $store $workload, $c clients over $(conns_name "$c" "$conns") connections (pool $pool)"
    run_bench "$name" OURS_ERR "$name" --workload "$workload" --clients "$c" \
        --connections "$conns" "${db_pid[@]}" --label "$store pool=$pool" "$@"
    stop_pooler
}

# ratio A B: A / B to two places, or "-".
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN {
        if (a != "null" && a != "" && b != "null" && b != "" && b + 0 > 0) printf "%.2f", a / b
        else print "-" }'
}

# us_per_rpc MS_PER_OP RPCS [MINUS_MS...]: (MS_PER_OP - the others) * 1000 / RPCS, or "-".
us_per_rpc() {
    local v=$1 n=$2 m
    shift 2
    for m in "$v" "$@"; do [[ $m == null || -z $m ]] && { echo "-"; return; }; done
    awk -v v="$v" -v n="$n" -v rest="$*" 'BEGIN {
        k = split(rest, r, " "); for (i = 1; i <= k; i++) v -= r[i]
        printf "%.0f", v * 1000 / n }'
}

# add_row LABEL C CONNS HAS_PGBENCH FLOOR_SHAPE RPCS: one row of each table and one JSON cell
# from PGB_*, FLOOR_* and OURS_* (FLOOR_SHAPE none: no floor; RPCS: gRPC calls per operation).
add_row() {
    local label=$1 c=$2 conns=$3 has_pg=$4 shape=$5 rpcs=$6 f=$OURS_JSON_FILE
    local nconn tps p50 p99 p999 peak errs pg_tps pg_pct pg_err pg_json floor_json
    local fl_tps="-" fl_pct="-" fl_err="-" fl_p50=null fl_p99=null fl_raw=null
    nconn=$(conns_name "$c" "$conns")
    tps=$(json_get "$f" throughput_ops_s)
    p50=$(json_get "$f" latency_ms.p50)
    p99=$(json_get "$f" latency_ms.p99)
    p999=$(json_get "$f" latency_ms.p999)
    peak=$(json_get "$f" server_peak_rss_kib)
    errs=$(json_get "$f" failed_ops)
    [[ $errs == null ]] && errs="failed"
    if ((has_pg)); then
        pg_tps=$(fmt "$PGB_TPS" 0)
        pg_pct="$(fmt "$PGB_P50" 3) / $(fmt "$PGB_P99" 3)"
        pg_err=${PGB_FAILED:-?}
        pg_json=$PGB_JSON
    else
        pg_tps="-" pg_pct="-" pg_err="-" pg_json=null
        PGB_TPS="" PGB_P50=null PGB_P99=null PGB_DB_CPU=null PGB_CLIENT_CPU=null PGB_POOLER_CPU=null
        ROUNDS_PG=""
    fi
    if [[ $shape != none ]]; then
        fl_raw=$(json_get "$FLOOR_JSON_FILE" throughput_ops_s)
        fl_tps=$(fmt "$fl_raw" 0)
        fl_p50=$(json_get "$FLOOR_JSON_FILE" latency_ms.p50)
        fl_p99=$(json_get "$FLOOR_JSON_FILE" latency_ms.p99)
        fl_pct="$(fmt "$fl_p50" 3) / $(fmt "$fl_p99" 3)"
        fl_err=$(json_get "$FLOOR_JSON_FILE" failed_ops)
        [[ $fl_err == null ]] && fl_err="failed"
        floor_json="{\"stands_in_for\": \"$shape\", \"rounds_ops_s\": [$ROUNDS_FLOOR], \"report\": $(cat "$FLOOR_JSON_FILE")}"
    else
        floor_json=null
    fi
    CELLS_JSON+=("{\"workload\": \"$label\", \"clients\": $c, \"connections\": $nconn, \"rpcs_per_op\": $rpcs, \"rounds_ops_s\": {\"pgbench\": $( ((has_pg)) && echo "[$ROUNDS_PG]" || echo null), \"ours\": [$ROUNDS_OURS]}, \"pgbench\": $pg_json, \"floor\": $floor_json, \"ours\": $(cat "$f")}")
    [[ $peak == null ]] && peak="-" || peak=$(awk -v k="$peak" 'BEGIN { printf "%.1f", k / 1024 }')
    ROWS+=("| $label | $c | $nconn | $pg_tps | $fl_tps | $(fmt "$tps" 0) | $(ratio "$tps" "$PGB_TPS") | $(ratio "$tps" "$fl_raw") | $pg_pct | $fl_pct | $(fmt "$p50" 3) / $(fmt "$p99" 3) | $(fmt "$p999" 3) | $peak | $pg_err / $fl_err / $errs |")
    local cpu_pg="- | -" cpu_fl="- | -"
    ((has_pg)) && cpu_pg="$(fmt "$PGB_DB_CPU" 3) | $(fmt "$PGB_CLIENT_CPU" 3)"
    local fl_srv=null fl_bench=null
    if [[ $shape != none ]]; then
        fl_srv=$(json_get "$FLOOR_JSON_FILE" server_cpu.ms_per_op)
        fl_bench=$(json_get "$FLOOR_JSON_FILE" bench_cpu.ms_per_op)
        cpu_fl="$(fmt "$fl_srv" 3) | $(fmt "$fl_bench" 3)"
    fi
    local srv bench
    srv=$(json_get "$f" server_cpu.ms_per_op)
    bench=$(json_get "$f" bench_cpu.ms_per_op)
    CPU_ROWS+=("| $label | $c | $nconn | $cpu_pg | $cpu_fl | $(fmt "$(json_get "$f" db_cpu.ms_per_op)" 3) | $(fmt "$srv" 3) | $(fmt "$bench" 3) |")
    if [[ $shape != none ]]; then
        # The server's own latency: only where nothing queues, so that the three add up.
        local own="-"
        if ((has_pg && c == 1)); then own=$(us_per_rpc "$p50" "$rpcs" "$fl_p50" "$PGB_P50"); fi
        FLOOR_ROWS+=("| $label | $c | $nconn | $rpcs | $(us_per_rpc "$fl_srv" "$rpcs") | $(us_per_rpc "$srv" "$rpcs") | $(us_per_rpc "$srv" "$rpcs" "$fl_srv") | $(us_per_rpc "$fl_bench" "$rpcs") | $(us_per_rpc "$bench" "$rpcs") | $(us_per_rpc "$p50" "$rpcs" "$fl_p50") | $own |")
        if [[ $label == *"(PostgreSQL)" ]]; then # the pooler cells are not drawn
            PLOT_ROWS+=("${label%% *} $c $nconn ${PGB_TPS:-null} $fl_raw $tps $PGB_P50 $PGB_P99 $fl_p50 $fl_p99 $p50 $p99")
        fi
    fi
}

# note_direct WORKLOAD C: keeps the direct cell's figures just added (add_row), for the pooler
# table's direct side.
declare -A DIRECT
note_direct() {
    local f=$OURS_JSON_FILE
    DIRECT["$1|$2"]="${PGB_TPS:-null} $PGB_P50 $PGB_P99 $(json_get "$f" throughput_ops_s) $(json_get "$f" latency_ms.p50) $(json_get "$f" latency_ms.p99)"
}

# add_pooler_row WORKLOAD C: the pooler table's rows for the pooler cell just added (add_row),
# beside the direct cell of the same workload and clients (when --clients measured it).
POOLER_ROWS=()
POOLER_CPU_ROWS=()
add_pooler_row() {
    local w=$1 c=$2 f=$OURS_JSON_FILE d
    local d_pg_tps d_pg_p50 d_pg_p99 d_tps d_p50 d_p99 tps p50 p99
    d=${DIRECT["$w|$c"]:-null null null null null null}
    read -r d_pg_tps d_pg_p50 d_pg_p99 d_tps d_p50 d_p99 <<<"$d"
    tps=$(json_get "$f" throughput_ops_s)
    p50=$(json_get "$f" latency_ms.p50)
    p99=$(json_get "$f" latency_ms.p99)
    POOLER_ROWS+=("| $w | $c | $(pool_size "$c") | $(fmt "$d_pg_tps" 0) → $(fmt "$PGB_TPS" 0) | $(ratio "$PGB_TPS" "$d_pg_tps") | $(fmt "$d_tps" 0) → $(fmt "$tps" 0) | $(ratio "$tps" "$d_tps") | $(ratio "$d_tps" "$d_pg_tps") → $(ratio "$tps" "$PGB_TPS") | $(fmt "$d_pg_p50" 3) / $(fmt "$d_pg_p99" 3) → $(fmt "$PGB_P50" 3) / $(fmt "$PGB_P99" 3) | $(fmt "$d_p50" 3) / $(fmt "$d_p99" 3) → $(fmt "$p50" 3) / $(fmt "$p99" 3) |")
    POOLER_CPU_ROWS+=("| $w | $c | $(fmt "$PGB_DB_CPU" 3) | $(fmt "$PGB_POOLER_CPU" 3) | $(fmt "$PGB_CLIENT_CPU" 3) | $(fmt "$(json_get "$f" db_cpu.ms_per_op)" 3) | $(fmt "$(json_get "$f" pooler_cpu.ms_per_op)" 3) | $(fmt "$(json_get "$f" server_cpu.ms_per_op)" 3) | $(fmt "$(json_get "$f" bench_cpu.ms_per_op)" 3) |")
}

# median LINES...: of "value payload" lines, the payload of the median value.
median() { printf '%s\n' "$@" | sort -g | sed -n "$((($# + 1) / 2))p" | cut -d' ' -f2-; }

PGB_VARS="PGB_TPS PGB_AVG PGB_DONE PGB_FAILED PGB_P50 PGB_P99 PGB_DB_CPU PGB_CLIENT_CPU PGB_POOLER_CPU PGB_JSON"

# cell STORE WORKLOAD C CONNS WITH_PGBENCH FLOOR_SHAPE [ledger-bench args...]: --rounds rounds
# of the cell, alternating the sides (pgbench, the floor standing in for FLOOR_SHAPE unless it
# is none, ours); leaves each side's median round in PGB_*, FLOOR_JSON_FILE and
# OURS_JSON_FILE, and every round's throughput in ROUNDS_PG, ROUNDS_FLOOR and ROUNDS_OURS.
# pgbench has no connections to share: a cell that differs from an earlier one of the round
# only in CONNS reuses its pgbench run.
cell() {
    local store=$1 workload=$2 c=$3 conns=$4 with_pg=$5 shape=$6 pg=() floor=() ours=() v tps
    shift 6
    for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
        if ((with_pg)); then
            local vars=$WORK/pgbench/vars-$store-$workload-c$c-r$ROUND.sh
            if [[ ! -s $vars ]]; then
                pgbench_cell "$workload" "$c" "$store"
                for v in $PGB_VARS; do printf '%s=%q\n' "$v" "${!v}"; done >"$vars"
            else
                # shellcheck disable=SC1090
                source "$vars"
            fi
            pg+=("${PGB_TPS:-0} $vars")
        fi
        if [[ $shape != none ]]; then
            floor_cell "$shape" "$c" "$conns"
            tps=$(json_get "$FLOOR_JSON_FILE" throughput_ops_s)
            floor+=("$([[ $tps == null ]] && echo 0 || echo "$tps") $FLOOR_JSON_FILE")
        fi
        ours_cell "$store" "$workload" "$c" "$conns" "$@"
        tps=$(json_get "$OURS_JSON_FILE" throughput_ops_s)
        ours+=("$([[ $tps == null ]] && echo 0 || echo "$tps") $OURS_JSON_FILE")
    done
    ROUNDS_PG="" ROUNDS_FLOOR="" ROUNDS_OURS=$(printf '%s\n' "${ours[@]}" | cut -d' ' -f1 | paste -sd, -)
    if ((with_pg)); then
        # shellcheck disable=SC1090
        source "$(median "${pg[@]}")"
        ROUNDS_PG=$(printf '%s\n' "${pg[@]}" | cut -d' ' -f1 | paste -sd, -)
    fi
    if [[ $shape != none ]]; then
        FLOOR_JSON_FILE=$(median "${floor[@]}")
        ROUNDS_FLOOR=$(printf '%s\n' "${floor[@]}" | cut -d' ' -f1 | paste -sd, -)
    fi
    OURS_JSON_FILE=$(median "${ours[@]}")
}

# The latency of a one-row INSERT committed alone (1 client, 3 s): the disk's fsync, which
# dominates the low-concurrency figures and varies on a shared machine; taken before and after.
echo "INSERT INTO probe VALUES (1);" >"$WORK/probe.sql"
commit_probe() {
    ((SMOKE)) && { echo "-"; return; }
    "${PSQL[@]}" -d postgres -c "DROP TABLE IF EXISTS probe" -c "CREATE TABLE probe (x int)"
    "$PGBENCH" -h 127.0.0.1 -p "$PGPORT" -U postgres -n -M prepared -c 1 -j 1 -T 3 \
        -f "$WORK/probe.sql" postgres 2>/dev/null |
        sed -n 's/^latency average = \([0-9.]*\) ms.*/\1/p'
}

T0=$(date +%s)
PROBE_BEFORE=$(commit_probe)

# ---- PostgreSQL: pgbench, the floor and ours, cell by cell -----------------------------------
for workload in claim-complete replay; do
    extra=()
    rpcs=2 # gRPC calls per operation: a Claim and a Complete
    if [[ $workload == replay ]]; then extra=(--hot-keys "$HOT_KEYS") rpcs=1; fi
    for c in $CLIENTS; do
        cell postgres "$workload" "$c" 0 1 "$workload" "${extra[@]}"
        add_row "$workload (PostgreSQL)" "$c" 0 1 "$workload" "$rpcs"
        note_direct "$workload" "$c"
    done
    # The way agents connect: many clients multiplexed over a few HTTP/2 connections, beside
    # the same clients with a connection each (unless --clients measured that already).
    if [[ $workload == claim-complete ]] && ((MUX_CLIENTS > 0)); then
        mux_conns=("$MUX_CONNECTIONS")
        [[ " $CLIENTS " == *" $MUX_CLIENTS "* ]] || mux_conns=(0 "$MUX_CONNECTIONS")
        for conns in "${mux_conns[@]}"; do
            cell postgres claim-complete "$MUX_CLIENTS" "$conns" 1 claim-complete
            add_row "claim-complete (PostgreSQL)" "$MUX_CLIENTS" "$conns" 1 claim-complete 2
            ((conns != 0)) || note_direct claim-complete "$MUX_CLIENTS"
        done
    fi
    # Through PgBouncer in transaction mode, pgbench and ours alike, beside the direct cells.
    if [[ " $POOLER_WORKLOADS " == *" $workload "* ]]; then
        for c in $POOLER_CLIENTS; do
            cell pgbouncer "$workload" "$c" 0 1 "$workload" "${extra[@]}"
            add_row "$workload (PostgreSQL via PgBouncer)" "$c" 0 1 "$workload" "$rpcs"
            add_pooler_row "$workload" "$c"
        done
    fi
done
if [[ -n $WAIT_CLIENTS ]]; then
    cell postgres mixed-wait "$WAIT_CLIENTS" 0 0 none
    add_row "mixed-wait (PostgreSQL)" "$WAIT_CLIENTS" 0 0 none 2
fi

# ---- SQLite through the server (the floor: the same as PostgreSQL's, reused when measured) ---
for c in $SQLITE_CLIENTS; do
    cell sqlite claim-complete "$c" 0 0 claim-complete
    add_row "claim-complete (SQLite)" "$c" 0 0 claim-complete 2
done

# ---- --scale: an empty table against a loaded one --------------------------------------------
SCALE_ROWS_MD=()
SCALE_JSON=null
if ((SCALE)); then
    scale_run() { # PHASE: claim-complete and lookup at SCALE_CLIENTS, one round each
        local phase=$1 lookup_args
        ROUND=$phase
        KEEP_TABLE=1 ours_cell postgres claim-complete "$SCALE_CLIENTS" 0
        cp "$OURS_JSON_FILE" "$WORK/json/scale-$phase-cc.json"
        if [[ $phase == empty ]]; then lookup_args=(--hot-keys "$LOOKUP_KEYS"); else
            lookup_args=(--preloaded "$SCALE_ROWS" --preloaded-prefix bench-preload-); fi
        KEEP_TABLE=1 ours_cell postgres lookup "$SCALE_CLIENTS" 0 "${lookup_args[@]}"
        cp "$OURS_JSON_FILE" "$WORK/json/scale-$phase-lookup.json"
    }
    reset_table
    scale_run empty
    reset_table
    log "loading $SCALE_ROWS finished entries"
    now_us=$(($(date +%s) * 1000000))
    chunk=500000
    for ((lo = 0; lo < SCALE_ROWS; lo += chunk)); do
        hi=$((lo + chunk - 1 < SCALE_ROWS - 1 ? lo + chunk - 1 : SCALE_ROWS - 1))
        # Keys as ledger-bench --preloaded derives them; started over the last day, in key
        # order of i; SUCCEEDED a quarter second later; kept 7 days, so none expires meanwhile.
        "${PSQL[@]}" -d ledger -v lo="$lo" -v hi="$hi" -v rows="$SCALE_ROWS" -v now_us="$now_us" \
            -v result="$RESULT" <<'SQL'
INSERT INTO ledger_entries (tenant, key, run_id, tool, fingerprint, status, attempt,
    claim_token, result, error, retryable, principal, started_at, finished_at,
    lease_expires_at, retention_us, expires_at, replay_count)
SELECT 'default', encode(sha256(convert_to('bench-preload-' || i, 'UTF8')), 'hex'),
    'run-' || (i / 4), (ARRAY['issue_credit', 'open_ticket', 'send_reply'])[1 + i % 3],
    encode(sha256(convert_to('fp-' || (i % 1000), 'UTF8')), 'hex'), 'SUCCEEDED', 1,
    md5('preload-token-' || i), convert_to(:'result', 'UTF8'), '', false, 'agent-' || (i % 50),
    s, s + 250000, s + 60000000, 604800000000, s + 250000 + 604800000000, i % 3
FROM generate_series(:lo::bigint, :hi::bigint) AS i,
    LATERAL (SELECT :now_us::bigint - 86400000000 + i * 86400000000 / :rows AS s) AS t;
SQL
        log "  $((hi + 1)) rows"
    done
    "${PSQL[@]}" -d ledger -c "VACUUM ANALYZE ledger_entries" -c "CHECKPOINT"
    scale_run loaded
    for m in "claim-complete ops/s|cc|throughput_ops_s" "claim-complete p50 ms|cc|latency_ms.p50" \
        "claim-complete p99 ms|cc|latency_ms.p99" "lookup ops/s|lookup|throughput_ops_s" \
        "lookup p50 ms|lookup|latency_ms.p50" "lookup p99 ms|lookup|latency_ms.p99"; do
        IFS='|' read -r title which field <<<"$m"
        e=$(json_get "$WORK/json/scale-empty-$which.json" "$field")
        l=$(json_get "$WORK/json/scale-loaded-$which.json" "$field")
        r=$(awk -v a="$l" -v b="$e" 'BEGIN { if (b + 0 > 0 && a != "null") printf "%.2f", a / b; else print "-" }')
        SCALE_ROWS_MD+=("| $title | $(fmt "$e" 3) | $(fmt "$l" 3) | $r |")
    done
    SCALE_JSON="{\"rows\": $SCALE_ROWS, \"clients\": $SCALE_CLIENTS"
    for f in empty-cc empty-lookup loaded-cc loaded-lookup; do
        SCALE_JSON+=", \"${f//-/_}\": $(cat "$WORK/json/scale-$f.json")"
    done
    SCALE_JSON+="}"
fi

# ---- the record ------------------------------------------------------------------------------
PROBE_AFTER=$(commit_probe)
mkdir -p "$(dirname "$RESULT_BASE")"
ELAPSED=$(($(date +%s) - T0))
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || COMMIT="$COMMIT+uncommitted"
CORES=$(nproc)
MEM=$(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
PGVER=$("$PG_BIN/postgres" --version | awk '{ print $3 }')
if ((SMOKE)); then MODE="smoke: $SMOKE_OPS operations per cell, no warm-up"; else
    MODE="${DURATION}s per cell after a ${WARMUP}s warm-up"; fi
((ROUNDS > 1)) && MODE="$MODE; $ROUNDS rounds per cell, each side's median round shown"
case $POOL in
    default) POOLTXT="the server's default (16)" ;;
    match) POOLTXT="clients + 1 (match)" ;;
    *) POOLTXT=$POOL ;;
esac

POOLER_JSON=null
if ((${#POOLER_ROWS[@]})); then
    POOLER_JSON="{\"program\": \"$POOLER_VERSION\", \"pool_mode\": \"transaction\", \"default_pool_size\": \"the server's pool\", \"pgbench_query_mode\": \"extended\", \"server\": \"--postgres-pooler transaction\"}"
fi

PICTURE=$RESULT_BASE.png
{
    echo "# Ledger server vs hand-written SQL and the gRPC floor"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ); commit $COMMIT; $MODE; total ${ELAPSED}s"
    echo "- machine: $CORES cores, $MEM, $(uname -sr); server, database and load generators share it"
    echo "- PostgreSQL $PGVER: fsync=on, synchronous_commit=on, shared_buffers=128MB, max_connections=$PG_MAX_CONNECTIONS; a truncated table and a checkpoint before each cell"
    ((SMOKE)) || echo "- a one-row INSERT committed alone (the disk's fsync) took ${PROBE_BEFORE:-?} ms before the cells and ${PROBE_AFTER:-?} ms after"
    echo "- pgbench: \`-n -M prepared -c C -j min(C,2)\`, bench/pgbench/*.sql, one database connection per client; floor: ledger-floor (the server's tonic stack, runtime, listener and HTTP/2 settings; no database, no ledger) driven by ledger-bench making the RPCs of one operation with the ledger's message sizes; ours: ledger-bench against the server, pool (\`--db-max-connections\`) $POOLTXT for PostgreSQL, the default for SQLite"
    if ((${#POOLER_ROWS[@]})); then
        echo "- via PgBouncer: $POOLER_VERSION in transaction mode (\`pool_mode = transaction\`), a fresh one for each side of a cell, \`default_pool_size\` = the server's pool (so pgbench's C clients and the server reach PostgreSQL over the same number of connections); pgbench \`-M extended\` (unnamed statements, each autocommit), ours \`--postgres-pooler transaction\` (each store call BEGIN … COMMIT, unnamed statements), migrations directly"
    fi
    echo "- connections: ledger-bench's HTTP/2 connections, for the floor and ours alike; as many as clients: one per client; fewer: client i uses connection i mod N (a runtime's channel pool)"
    echo "- one op: claim-complete = Claim of a new key + Complete (2 RPCs); replay = Claim of one of $HOT_KEYS completed keys (1 RPC); for pgbench one transaction of bench/pgbench/<workload>.sql, the server's statements for that op, each autocommit; ratios of ops/s"
    ((PLOT)) && echo "- picture: [$(basename "$PICTURE")]($(basename "$PICTURE")) (throughput and p50/p99 latency against clients)"
    echo
    echo "| workload | clients | connections | pgbench ops/s | floor ops/s | ours ops/s | ours / pgbench | ours / floor | pgbench p50 / p99 ms | floor p50 / p99 ms | ours p50 / p99 ms | ours p99.9 ms | server peak RSS MiB | errors (pgbench / floor / ours) |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "## CPU per operation (ms, user + system, over the measured run)"
    echo
    echo "| workload | clients | connections | pgbench: database | pgbench: pgbench | floor: server | floor: ledger-bench | ours: database | ours: server | ours: ledger-bench |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    printf '%s\n' "${CPU_ROWS[@]}"
    echo
    echo "## Above the floor, per RPC (µs)"
    echo
    echo "CPU: the server process's, per gRPC call, the floor's and ours; ours − floor is what the ledger adds to the transport (the database's CPU is apart, in the table above). Latency: ours' p50 less the floor's, per call (the database's time included), and, at one client, where nothing queues, less pgbench's p50 as well: what is left is the server's own time per call."
    echo
    echo "| workload | clients | connections | RPCs per op | floor: server CPU | ours: server CPU | ours − floor: server CPU | floor: ledger-bench CPU | ours: ledger-bench CPU | p50: ours − floor | p50: ours − floor − pgbench |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    printf '%s\n' "${FLOOR_ROWS[@]}"
    if ((${#POOLER_ROWS[@]})); then
        echo
        echo "## Through PgBouncer (transaction mode) vs direct"
        echo
        echo "Each figure direct → via PgBouncer. Direct: pgbench \`-M prepared\` over C connections, ours over its pool; via PgBouncer: pgbench \`-M extended\` and ours \`--postgres-pooler transaction\`, both over PgBouncer's pool of the server's size (the PostgreSQL connections column)."
        echo
        echo "| workload | clients | PostgreSQL connections via PgBouncer | pgbench ops/s | pgbench: PgBouncer / direct | ours ops/s | ours: PgBouncer / direct | ours / pgbench | pgbench p50 / p99 ms | ours p50 / p99 ms |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        printf '%s\n' "${POOLER_ROWS[@]}"
        echo
        echo "CPU per operation via PgBouncer (ms, user + system, over the measured run; direct: the CPU table above):"
        echo
        echo "| workload | clients | pgbench: database | pgbench: PgBouncer | pgbench: pgbench | ours: database | ours: PgBouncer | ours: server | ours: ledger-bench |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        printf '%s\n' "${POOLER_CPU_ROWS[@]}"
    fi
    if ((SCALE)); then
        echo
        echo "## Scale: empty table vs $SCALE_ROWS finished entries ($SCALE_CLIENTS clients)"
        echo
        echo "| measure | empty | loaded | loaded / empty |"
        echo "| --- | ---: | ---: | ---: |"
        printf '%s\n' "${SCALE_ROWS_MD[@]}"
    fi
    if ((${#FAILED_CELLS[@]})); then
        echo
        echo "**Cells with errors:** ${FAILED_CELLS[*]}"
    fi
} >"$RESULT_BASE.md"

{
    printf '{"date": "%s", "commit": "%s", "mode": "%s", "cores": %s, "memory": "%s", ' \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$COMMIT" "$MODE" "$CORES" "$MEM"
    printf '"postgres": "%s", "pool": "%s", "elapsed_s": %s, "commit_probe_ms": ["%s", "%s"], "failed_cells": [%s],\n' \
        "$PGVER" "$POOLTXT" "$ELAPSED" "$PROBE_BEFORE" "$PROBE_AFTER" \
        "$( ((${#FAILED_CELLS[@]})) && printf '"%s",' "${FAILED_CELLS[@]}" | sed 's/,$//')"
    echo ' "cells": ['
    for i in "${!CELLS_JSON[@]}"; do
        ((i > 0)) && echo ","
        printf '%s' "${CELLS_JSON[$i]}"
    done
    printf '\n ],\n "pooler": %s,\n "scale": %s}\n' "$POOLER_JSON" "$SCALE_JSON"
} >"$RESULT_BASE.json"

# ---- the picture -----------------------------------------------------------------------------
# Throughput and p50/p99 latency against clients, for claim-complete and replay on PostgreSQL:
# pgbench, the floor and ours with a connection per client as lines, the multiplexed cell as
# separate points.
draw_picture() {
    local dir=$WORK/plot w
    mkdir -p "$dir"
    for w in claim-complete replay; do
        # clients pg_tps floor_tps ours_tps pg_p50 pg_p99 floor_p50 floor_p99 ours_p50 ours_p99
        printf '%s\n' "${PLOT_ROWS[@]}" | awk -v w="$w" '$1 == w && $2 == $3' |
            cut -d' ' -f2,4- | sort -n >"$dir/$w.dat"
        # clients connections, then the same columns
        printf '%s\n' "${PLOT_ROWS[@]}" | awk -v w="$w" '$1 == w && $2 != $3' |
            cut -d' ' -f2- | sort -n >"$dir/$w-mux.dat"
    done
    local xtics xmax mux_label="" legend title
    xtics=$(printf '%s\n' "${PLOT_ROWS[@]}" | cut -d' ' -f2 | sort -nu |
        awk '{ printf "%s\"%s\" %s", (NR > 1 ? ", " : ""), $1, $1 }')
    xmax=$(printf '%s\n' "${PLOT_ROWS[@]}" | cut -d' ' -f2 | sort -n | tail -n1)
    if [[ -s $dir/claim-complete-mux.dat ]]; then
        mux_label=$(awk 'NR == 1 { printf "%s/%s", $1, $2 }' "$dir/claim-complete-mux.dat")
    fi
    legend="lines: a connection per client (pgbench: to the database; floor and ours: HTTP/2)"
    [[ -z $mux_label ]] ||
        legend+="; large hollow marks ($mux_label): ${mux_label%/*} clients sharing ${mux_label#*/} HTTP/2 connections"
    title="commit $COMMIT, $(date -u +%Y-%m-%d), $MODE, $CORES cores shared by all processes"
    cat >"$dir/picture.gp" <<GNUPLOT
set terminal pngcairo size 1500,1200 font "sans,11" noenhanced
set output "$PICTURE"
set datafile missing "null"
set logscale x 2
set xrange [0.75:$xmax * 1.35]
set xtics ($xtics)
set xlabel "clients"
set grid xtics ytics lc rgb "#dddddd"
set key below horizontal maxcols 4 width -1 samplen 2 font ",10"
set bmargin 8
set border 3
set tics nomirror
set style line 1 lc rgb "#1f77b4" lw 2 pt 7 ps 1.1
set style line 2 lc rgb "#7f7f7f" lw 2 pt 5 ps 1.1
set style line 3 lc rgb "#d62728" lw 2 pt 9 ps 1.3
set style line 4 lc rgb "#1f77b4" lw 1.5 dt 2 pt 6 ps 1.1
set style line 5 lc rgb "#7f7f7f" lw 1.5 dt 2 pt 4 ps 1.1
set style line 6 lc rgb "#d62728" lw 1.5 dt 2 pt 8 ps 1.3
set style line 7 lc rgb "#7f7f7f" lw 2 pt 4 ps 2.2
set style line 8 lc rgb "#d62728" lw 2 pt 8 ps 2.4
set multiplot layout 2,2 title "ours (the ledger server) vs pgbench running its SQL vs the gRPC floor (ledger-floor)\n$title\n$legend" font "sans,12"
mux_label = "$mux_label"
do for [w in "claim-complete replay"] {
    data = "$dir/".w.".dat"
    mux = "$dir/".w."-mux.dat"
    has_mux = (w eq "claim-complete" && mux_label ne "")
    set title w." on PostgreSQL: throughput"
    set ylabel "operations per second"
    unset logscale y
    set yrange [0:*]
    if (has_mux) {
        plot data u 1:2 w lp ls 1 t "pgbench", data u 1:3 w lp ls 2 t "floor", \
             data u 1:4 w lp ls 3 t "ours", mux u 1:4 w p ls 7 t "floor ".mux_label, \
             mux u 1:5 w p ls 8 t "ours ".mux_label
    } else {
        plot data u 1:2 w lp ls 1 t "pgbench", data u 1:3 w lp ls 2 t "floor", \
             data u 1:4 w lp ls 3 t "ours"
    }
    set title w." on PostgreSQL: latency of an operation, p50 (solid) and p99 (dashed)"
    set ylabel "milliseconds (log scale)"
    set logscale y 10
    set yrange [*:*]
    if (has_mux) {
        plot data u 1:5 w lp ls 1 t "pgbench p50", data u 1:6 w lp ls 4 t "pgbench p99", \
             data u 1:7 w lp ls 2 t "floor p50", data u 1:8 w lp ls 5 t "floor p99", \
             data u 1:9 w lp ls 3 t "ours p50", data u 1:10 w lp ls 6 t "ours p99", \
             mux u 1:8 w p ls 7 t "floor ".mux_label." p50, p99", mux u 1:9 w p ls 7 notitle, \
             mux u 1:10 w p ls 8 t "ours ".mux_label." p50, p99", mux u 1:11 w p ls 8 notitle
    } else {
        plot data u 1:5 w lp ls 1 t "pgbench p50", data u 1:6 w lp ls 4 t "pgbench p99", \
             data u 1:7 w lp ls 2 t "floor p50", data u 1:8 w lp ls 5 t "floor p99", \
             data u 1:9 w lp ls 3 t "ours p50", data u 1:10 w lp ls 6 t "ours p99"
    }
}
unset multiplot
GNUPLOT
    rm -f "$PICTURE"
    gnuplot "$dir/picture.gp" 2>"$WORK/logs/gnuplot.log" && [[ -s $PICTURE ]]
}
if ((PLOT)); then
    if ((${#PLOT_ROWS[@]} == 0)); then
        log "no PostgreSQL cell to draw"
    elif draw_picture; then
        log "drew $PICTURE"
    else
        cat "$WORK/logs/gnuplot.log" >&2
        FAILED_CELLS+=("picture")
    fi
fi

cat "$RESULT_BASE.md"
log "wrote $RESULT_BASE.md and $RESULT_BASE.json in ${ELAPSED}s"
if ((${#FAILED_CELLS[@]})); then
    die "cells with errors: ${FAILED_CELLS[*]}"
fi
