#!/bin/sh
# The main job on the embedded default: a simulated 8-GPU host in the state the seed routine
# (`fuser -k /dev/nvidia*; sleep 5; nvidia-smi | grep 0MiB`) is used on, converged by pyinfra with gpu.idle.
set -eu
cd "$(dirname "$0")/.."
. scripts/venv.sh
export GPUSIM_ROOT="${GPUSIM_ROOT:-$PWD/.gpusim/host}"
pids="$GPUSIM_ROOT.demo-pids"
pyinfra() { .venv/bin/pyinfra "$@"; }
cleanup() {  # stop only what this script started: its holders by PID, its server through specops
    [ -f "$pids" ] && while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done < "$pids"
    rm -f "$pids"
    [ -d "$GPUSIM_ROOT/servers" ] && pyinfra -y inventory/sim.py operations.server.stopped >/dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup
"$PY" -m gpusim init "$GPUSIM_ROOT" --gpus 8 --release-delay 2
"$PY" -m gpusim reset "$GPUSIM_ROOT" >/dev/null
"$PY" -c 'import sys; from gpusim.host import SimHost; SimHost(__import__("pathlib").Path(sys.argv[1])).configure(server_start_s=3)' "$GPUSIM_ROOT"
hold() { "$PY" -m gpusim hold "$GPUSIM_ROOT" "$@" | "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(d["pid"]); print(d["watcher"])' >> "$pids"; }
hold --gpus 0,1,2,3 --mib 120000 --name python3              # a stale server that exits on SIGTERM
hold --gpus 4,5 --mib 70000 --name python3 --on-term ignore   # a benchmark that ignores SIGTERM
hold --gpus 0 --mib 300 --name nvidia-persistenced           # a protected daemon: never touched
smi="$GPUSIM_ROOT/bin/nvidia-smi"
echo "== before"; "$smi" --query-gpu=index,memory.used,memory.total --format=csv
"$smi" --query-compute-apps=pid,process_name,used_gpu_memory --format=csv
echo "== 1. every GPU idle: pyinfra -y inventory/sim.py deploy.py --data config=none --data grace_s=3"
pyinfra -y inventory/sim.py deploy.py --data config=none --data grace_s=3
echo "== after"; "$smi" --query-gpu=index,memory.used,memory.total --format=csv
"$smi" --query-compute-apps=pid,process_name,used_gpu_memory --format=csv
echo "== 2. EAGLE-3 server running: pyinfra -y inventory/sim.py deploy.py --data config=eagle3-llama3.1-8b"
pyinfra -y inventory/sim.py deploy.py --data config=eagle3-llama3.1-8b
echo "== 3. again: already converged, so no change"
pyinfra -y -v inventory/sim.py deploy.py --data config=eagle3-llama3.1-8b 2>&1 | grep -E "noop|No change"
echo "== 4. what switching to the baseline would change: --dry --diff"
pyinfra inventory/sim.py deploy.py --data config=baseline-llama3.1-8b --dry --diff 2>&1 | grep -E "~|server.running|Will|[-+] exec"
echo "== 5. switch to the baseline (no OOM: the old server is stopped and its memory proven released first)"
pyinfra -y inventory/sim.py deploy.py --data config=baseline-llama3.1-8b
"$smi" --query-compute-apps=pid,process_name,used_gpu_memory --format=csv
echo "== 6. benchmark sweep, baseline vs EAGLE-3 at concurrency 1..32 (resumable; report with the crossover)"
results="$GPUSIM_ROOT.sweep-results"
rm -rf "$results"
pyinfra -y inventory/sim.py sweep.py --data configs=baseline-llama3.1-8b,eagle3-llama3.1-8b \
    --data concurrency=1,2,4,8,16,32 --data num_prompts=32 --data input_len=128 --data output_len=32 \
    --data results="$results" 2>&1 | grep -E "sweep.benchmarked .*tok/s|  [|#] |stops paying|helps|sweep report"
echo "== 7. the same sweep again: every level has its result, nothing runs"
pyinfra -y inventory/sim.py sweep.py --data configs=baseline-llama3.1-8b,eagle3-llama3.1-8b \
    --data concurrency=1,2,4,8,16,32 --data num_prompts=32 --data input_len=128 --data output_len=32 \
    --data results="$results" 2>&1 | grep -E "up to date|Grand total"
