#!/usr/bin/env bash
# Create, exec and fork of one branch, timed side by side for two builds of forkd (say,
# before and after a change to how sandbox roots are made), each on a private daemon of
# its own, rounds alternating between them so that both see the same machine.
#
# Usage: benches/identity/before-after.sh OLD_FORKD NEW_FORKD [ROUNDS]
#   OLD_FORKD, NEW_FORKD  forkd binaries (forkd-init beside each)
#   ROUNDS                samples of each operation per build (default 30)
# Images: $FORKD_CACHE/images/busybox.tar and debian.tar.zst (fixtures/setup.sh busybox
# debian). Each build's daemon gets its own state root under a scratch directory.
# Reports, per build and image, p50 and p90 of the daemon's own time for a create
# (`create_us`), the whole `forkd exec` process, and a fork of one branch of a live
# checkpoint (the fork's `total` phase), and new/old ratios of the p50s; JSON goes to
# target/bench/identity.json.
set -euo pipefail
old="${1:?usage: before-after.sh OLD_FORKD NEW_FORKD [ROUNDS]}"
new="${2:?usage: before-after.sh OLD_FORKD NEW_FORKD [ROUNDS]}"
rounds="${3:-30}"
cache="${FORKD_CACHE:-/var/cache/forkd}"
scratch="$(mktemp -d /var/tmp/forkd-identity-bench.XXXXXX)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    for r in "$scratch"/*/root; do umount "$r/vol" 2>/dev/null || true; done
    rm -rf "$scratch"
}
trap cleanup EXIT

start() { # start NAME BIN
    local dir="$scratch/$1"
    mkdir -p "$dir"
    FORKD_ROOT="$dir/root" FORKD_SOCKET="$dir/sock" FORKD_VOLUME_SIZE=16G \
        "$2" daemon >"$dir/daemon.log" 2>&1 &
    pids+=("$!")
    local i=0
    until FORKD_SOCKET="$dir/sock" "$2" ps >/dev/null 2>&1; do
        i=$((i + 1)); [ "$i" -lt 600 ] || { tail "$dir/daemon.log"; exit 1; }
        sleep 0.2
    done
    FORKD_SOCKET="$dir/sock" "$2" image import "$cache/images/busybox.tar" --name busybox >/dev/null
    FORKD_SOCKET="$dir/sock" "$2" image import "$cache/images/debian.tar.zst" --name debian >/dev/null
}
f() { local n="$1" bin="$2"; shift 2; FORKD_SOCKET="$scratch/$n/sock" "$bin" "$@"; }
now_us() { echo $(( $(date +%s%N) / 1000 )); }

start old "$old"
start new "$new"
declare -A live
for n in old new; do
    bin=$old; [ $n = new ] && bin=$new
    for img in busybox debian; do
        # The first create of an image (with bases, it makes the image's base).
        t0=$(now_us); id=$(f $n $bin run -d $img -- sleep infinity); t1=$(now_us)
        echo "$n $img first-create $((t1 - t0))" >>"$scratch/samples"
        live[$n-$img]=$(f $n $bin checkpoint --live "$id")
    done
done
for r in $(seq 1 "$rounds"); do
    for n in old new; do
        bin=$old; [ $n = new ] && bin=$new
        for img in busybox debian; do
            id=$(f $n $bin run -d $img -- sleep infinity)
            us=$(f $n $bin inspect --json "$id" | python3 -c 'import json,sys; d = json.load(sys.stdin); d = d[0] if isinstance(d, list) else d; print(d["create_us"])')
            echo "$n $img create $us" >>"$scratch/samples"
            t0=$(now_us); f $n $bin exec "$id" -- true; t1=$(now_us)
            echo "$n $img exec $((t1 - t0))" >>"$scratch/samples"
            f $n $bin rm -f "$id" >/dev/null
            out=$(f $n $bin fork --json "${live[$n-$img]}")
            echo "$out" | python3 -c 'import json,sys
d = json.load(sys.stdin); b = d["branches"][0]
print(sys.argv[1], sys.argv[2], "fork", b["phases_us"]["total"])
print(b["id"], file=open(sys.argv[3], "w"))' $n $img "$scratch/branch" >>"$scratch/samples"
            f $n $bin rm -f "$(cat "$scratch/branch")" >/dev/null
        done
    done
done
mkdir -p target/bench
python3 - "$scratch/samples" "$rounds" <<'PY'
import json, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
def pct(v, p):
    v = sorted(v); return v[min(len(v) - 1, int(p * len(v)))]
out, table = {}, []
for img in ("busybox", "debian"):
    for op in ("first-create", "create", "exec", "fork"):
        got = {}
        for b in ("old", "new"):
            v = [int(r[3]) / 1000 for r in rows if r[0] == b and r[1] == img and r[2] == op]
            got[b] = {"n": len(v), "p50_ms": pct(v, .5), "p90_ms": pct(v, .9)}
        got["ratio_p50"] = got["new"]["p50_ms"] / got["old"]["p50_ms"]
        out[f"{img}/{op}"] = got
        table.append(f"| {img} | {op} | {got['old']['p50_ms']:.2f} / {got['old']['p90_ms']:.2f} | "
                     f"{got['new']['p50_ms']:.2f} / {got['new']['p90_ms']:.2f} | {got['ratio_p50']:.2f}x |")
json.dump(out, open("target/bench/identity.json", "w"), indent=1)
print(f"rounds: {sys.argv[2]} (first-create: 1)\n")
print("| image | operation | before p50 / p90 ms | after p50 / p90 ms | after/before p50 |")
print("|---|---|---:|---:|---:|")
print("\n".join(table))
PY
