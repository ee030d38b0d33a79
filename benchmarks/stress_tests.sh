#!/usr/bin/env bash
# The distributed and kill tests, N runs in a row, beside one CPU-hog process (a Python busy loop).
# Stops at the first failing run. Each run's log: $OUT/run_<i>.log; one line per run: $OUT/summary.txt.
#
#     bash benchmarks/stress_tests.sh [N=20] [OUT=/tmp/coci-stress]
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-20}
OUT=${2:-/tmp/coci-stress}
mkdir -p "$OUT"
PY=.venv/bin/python
FILES="tests/distributed/test_distributed.py tests/integration/test_faults.py tests/integration/test_lightning.py tests/integration/test_preemption.py
  tests/distributed/test_preemption_distributed.py tests/distributed/test_remote_distributed.py tests/integration/test_resume_kill.py tests/distributed/test_sharded.py
  tests/unit/test_own_state.py tests/integration/test_torchdata.py tests/integration/test_models.py tests/integration/test_remote.py tests/distributed/test_multinode.py
  tests/integration/test_transformers.py tests/integration/test_accelerate.py tests/integration/test_remote_history.py tests/unit/test_hostile_files.py"
# shellcheck disable=SC2086
$PY -m pytest --collect-only -q -m "distributed or slow" $FILES 2>/dev/null | grep :: | grep -v test_builder_loss > "$OUT/ids.txt"
echo "$(wc -l < "$OUT/ids.txt") tests" > "$OUT/summary.txt"
$PY -c "while True: pass" &
HOG=$!
trap 'kill $HOG' EXIT
for i in $(seq 1 "$N"); do
  start=$(date +%s)
  # shellcheck disable=SC2046
  $PY -m pytest -n 2 -q -p no:cacheprovider --durations=15 $(cat "$OUT/ids.txt") > "$OUT/run_$i.log" 2>&1
  rc=$?
  echo "run $i rc=$rc $(( $(date +%s) - start ))s $(tail -1 "$OUT/run_$i.log")" | tee -a "$OUT/summary.txt"
  [ $rc -ne 0 ] && exit $rc
done
