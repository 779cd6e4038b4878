#!/bin/sh
# The main job on the embedded default: a simulated 8-GPU host in the state the seed routine
# (`fuser -k /dev/nvidia*; sleep 5; nvidia-smi | grep 0MiB`) is used on, converged by pyinfra with gpu.idle.
set -eu
cd "$(dirname "$0")/.."
. scripts/venv.sh
export GPUSIM_ROOT="${GPUSIM_ROOT:-$PWD/.gpusim/host}"
pids="$GPUSIM_ROOT.demo-pids"
cleanup() {  # stop only what this script started, by PID
    [ -f "$pids" ] && while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done < "$pids"
    rm -f "$pids"
}
trap cleanup EXIT
cleanup
"$PY" -m gpusim init "$GPUSIM_ROOT" --gpus 8 --release-delay 2
"$PY" -m gpusim reset "$GPUSIM_ROOT" >/dev/null
hold() { "$PY" -m gpusim hold "$GPUSIM_ROOT" "$@" | "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(d["pid"]); print(d["watcher"])' >> "$pids"; }
hold --gpus 0,1,2,3 --mib 120000 --name python3              # a stale server that exits on SIGTERM
hold --gpus 4,5 --mib 70000 --name python3 --on-term ignore   # a benchmark that ignores SIGTERM
hold --gpus 0 --mib 300 --name nvidia-persistenced           # a protected daemon: never touched
smi="$GPUSIM_ROOT/bin/nvidia-smi"
echo "== before"; "$smi" --query-gpu=index,memory.used,memory.total --format=csv
"$smi" --query-compute-apps=pid,process_name,used_gpu_memory --format=csv
echo "== converge: pyinfra -y inventory/sim.py deploy.py --data grace_s=3"
.venv/bin/pyinfra -y inventory/sim.py deploy.py --data grace_s=3
echo "== after"; "$smi" --query-gpu=index,memory.used,memory.total --format=csv
"$smi" --query-compute-apps=pid,process_name,used_gpu_memory --format=csv
echo "== again: already converged, so no change"
.venv/bin/pyinfra -y -v inventory/sim.py deploy.py | grep -E "noop|GPUs idle"
