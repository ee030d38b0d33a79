#!/usr/bin/env bash
# The checks that need the lent GPU machine, in one call, each step bounded so that a failing
# step cannot eat the others' time: the CUDA tests, the CUDA path benchmark, then the CPU
# measurements that a 2-core machine cannot resolve (sharded 2-rank stall, checksum from outside,
# the report's overhead against an outside measurement), as long as the budget lasts.
#
#   bash benchmarks/device_checks.sh [SECONDS] [STEP ...]   (default 500 s, every step; logs under
#                                                            $OUT or ./device-out)
#
# That machine has torch, numpy, scipy, pandas and pytest but not pydantic, crc32c or obstore; they
# travel as Python 3.12 wheels in an ignored .whl/, fetched here with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     --platform manylinux1_x86_64 -d .whl pydantic pydantic_core annotated-types typing-inspection \
#     typing_extensions crc32c obstore
# (the versions .venv has), and installed into /tmp/site below.
set -u
budget=${1:-500}
out=${OUT:-device-out}
mkdir -p "$out"
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
shift $(( $# > 0 ? 1 : 0 ))
wanted=" $* "
step() {  # step NAME MAX_SECONDS CMD...: run CMD for at most MAX_SECONDS or what is left
    local name=$1 max=$2; shift 2
    if [ "$wanted" != "  " ] && [[ "$wanted" != *" $name "* ]]; then return; fi
    local limit; limit=$(left); (( limit > max )) && limit=$max
    if (( limit < 20 )); then echo "== $name: skipped, $limit s left"; return; fi
    echo "== $name (limit $limit s) $(date +%T)"
    local t0; t0=$(date +%s)
    timeout -k 5 "$limit" "$@" > "$out/$name.log" 2>&1
    echo "== $name: rc $? in $(( $(date +%s) - t0 )) s"
    tail -n 40 "$out/$name.log"
}

if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 COCI_BENCH_DIR=/tmp
nvidia-smi -L; nproc; python3 -c 'import sys, torch, coci; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())'

step cuda_tests 150 python3 -m pytest -q -p no:cacheprovider tests/unit/test_cuda.py \
    tests/unit/test_profiler_loss_trace.py::test_cuda_losses_do_not_synchronise_per_step
step cuda_path 120 python3 benchmarks/cuda_path.py --mb 500 --pairs 8
step sharded_96 60 python3 benchmarks/sharded.py --mb 96 --repeats 9
step checkpoint_outside 150 python3 benchmarks/checkpoint_outside.py --rounds 11 --alone 15
step sharded_192 60 python3 benchmarks/sharded.py --mb 192 --repeats 7
step end_to_end_mlp 120 python3 benchmarks/end_to_end.py --steps 150 --pairs 5 --workloads mlp
step step_windows 90 python3 benchmarks/step_windows.py --runs 3 --steps 1200 --window 1
step end_to_end_1500_gpt 420 python3 benchmarks/end_to_end.py --steps 1500 --pairs 4 --workloads gpt
step overhead_accounting 400 python3 benchmarks/overhead_accounting.py --pairs 40 --steps 300
echo "== done in $(( $(date +%s) - start )) s"
