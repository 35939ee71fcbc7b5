#!/usr/bin/env bash
# Table II on one GPU machine (table2_gpu.yaml): one process per seed x model, all at once, each
# resumable, then one report. Usage:
#
#   scripts/table2_gpu.sh OUT [LIMIT_S] [--set KEY=VALUE ...]
#
# OUT       results folder (runs/ and cells/ are reused: calling again resumes where a call stopped)
# LIMIT_S   stop every process after this many seconds (0: no limit); for machines lent by the
#           call, e.g. 10 minutes: a killed process loses at most its running cell
# --set     passed to every process (e.g. --set data.root=/path/to/fashion-mnist)
#
# Environment: PYTHON (default python3), SEEDS (default "0 1 2"), MODELS (default
# "lenet mobilenetv3 resnet18"). Logs: OUT/logs/<model>.s<seed>.log, each ending with its wall
# time and exit status (124: stopped at LIMIT_S); OUT/logs/gpu.log samples nvidia-smi every 20 s.
# docs/reproducing.md, "GPU config", says what the table costs and how it compares with the paper.
set -u
if [ $# -lt 1 ]; then
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
out=$1
limit=${2:-0}
shift $(( $# >= 2 ? 2 : 1 ))
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out/logs"

if command -v nvidia-smi >/dev/null; then
    ( while sleep 20; do
        nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader
      done ) >> "$out/logs/gpu.log" 2>&1 &
    smi=$!
else
    smi=
fi

run_one() {  # model seed
    local t0 rc
    t0=$(date +%s)
    if [ "$limit" -gt 0 ]; then
        timeout "$limit" "$py" -m scaleflu experiment table2 --config table2_gpu --out "$out" \
            --no-report --no-progress --set "experiment.seeds=[$2]" --set "experiment.models=[$1]" "${sets[@]}"
    else
        "$py" -m scaleflu experiment table2 --config table2_gpu --out "$out" \
            --no-report --no-progress --set "experiment.seeds=[$2]" --set "experiment.models=[$1]" "${sets[@]}"
    fi
    rc=$?
    echo "table2_gpu.sh: $1 seed $2: exit $rc after $(( $(date +%s) - t0 )) s"
}

sets=("$@")
pids=()
t0=$(date +%s)
for m in ${MODELS:-lenet mobilenetv3 resnet18}; do
    for s in ${SEEDS:-0 1 2}; do
        run_one "$m" "$s" > "$out/logs/$m.s$s.log" 2>&1 &
        pids+=($!)
    done
done
wait "${pids[@]}"
[ -n "$smi" ] && kill "$smi" 2>/dev/null
echo "table2_gpu.sh: all processes ended after $(( $(date +%s) - t0 )) s:"
tail -qn 1 "$out"/logs/*.s*.log
"$py" -m scaleflu experiment table2 --config table2_gpu --out "$out" --report-only "${sets[@]}"
