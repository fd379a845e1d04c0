#!/usr/bin/env bash
# The accelerator against the CPU in one command, for a machine with a GPU and no network
# (issue #35, item 4; docs/validation.md "The accelerator against the CPU"):
# benchmarks/device_check.py's reference scenes and the bag's first 6 steps, on the GPU and
# on the CPU, each run in its own process; then the coarse bag's lockstep ensemble step at
# K = 1, 16 and 64 members on the default device (benchmarks/ensemble_step.py), and the
# 481-vertex bag's `ipcjax bag --ensemble K` from the tie checkpoint over 0.1 s at K = 1, 16
# and 64 (benchmarks/ensemble_bag.py: wall per member; the goal is 64 bags for at most 4×
# the wall of one). Exits non-zero when a check fails. The figures land in $OUT (default
# runs/gpu_check): device.txt, device_check.json/.log, ensemble_step.json/.log,
# ensemble_bag.json/.log.
#
# Such a machine has JAX with its CUDA plugin but not this project's pure-Python or small
# dependencies; bring the ones the checks import as wheels, made where pip works:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .whl qdldl==0.1.9.post1 meshio==5.3.5
# (.whl/ is ignored by git: `echo /.whl/ >> .git/info/exclude`). They are installed into
# /tmp/site here when python3 lacks them; the project itself runs from this checkout
# (PYTHONPATH).
#
# STAGES (default "device step bag") picks the stages: on this 2-core CPU the device stage
# alone took about 5 minutes, most of it NumPy's all-pairs queries; a GPU call has 10, so
# when time is short run `STAGES=device` and `STAGES="step bag"` as two calls.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
if ! python3 -c "import qdldl, meshio" 2> /dev/null && compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
{ if command -v nvidia-smi > /dev/null; then nvidia-smi -L; else echo "nvidia-smi: not found"; fi; \
  python3 -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"; } > "$OUT/device.txt"
cat "$OUT/device.txt"
STAGES=${STAGES:-device step bag}
for stage in $STAGES; do
  case $stage in
    device) python3 benchmarks/device_check.py --json "$OUT/device_check.json" 2>&1 | tee "$OUT/device_check.log" ;;
    step) python3 benchmarks/ensemble_step.py --members 1,16,64 --steps 6 --rounds 2 \
            --json "$OUT/ensemble_step.json" 2>&1 | tee "$OUT/ensemble_step.log" ;;
    bag) python3 benchmarks/ensemble_bag.py --resolution full --state scenes/data/bag_full_tie.npz --until 8.50 \
           --members 1,16,64 --rounds 1 --json "$OUT/ensemble_bag.json" 2>&1 | tee "$OUT/ensemble_bag.log" ;;
    *) echo "gpu_check.sh: unknown stage '$stage' (device, step, bag)" >&2; exit 2 ;;
  esac
done
