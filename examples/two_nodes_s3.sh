#!/usr/bin/env bash
# Two nodes, each with its own run directory on its own disk, and an S3 remote so that a lost node's
# part of a checkpoint can be fetched back: examples/fsdp2.py under two torchrun agents.
#
#   export AWS_ENDPOINT_URL=... AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... AWS_DEFAULT_REGION=...
#   examples/two_nodes_s3.sh /tmp/two-nodes s3://my-bucket/run1 --epochs 2 [--kill-at STEP]
#   rm -rf /tmp/two-nodes/node1                                   # "node 1 is lost"
#   examples/two_nodes_s3.sh /tmp/two-nodes s3://my-bucket/run1 --epochs 2   # node 1 fetches its part
#
# This runs both "nodes" on one machine (localhost rendezvous). On a cluster, run only the torchrun
# line on each node, with --node-rank K, --master-addr NODE0_HOST and a local --run-dir. The static
# rendezvous keeps --node-rank, so each node finds its own part on its disk after any restart
# (c10d numbers the nodes by arrival: see docs/guides/multi-node.md).
set -euo pipefail
base=$1 remote=$2
shift 2
python=${PYTHON:-python}
port=${RDZV_PORT:-29531}
pids=()
for node in 0 1; do
    "$python" -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank "$node" \
        --rdzv-backend static --master-addr 127.0.0.1 --master-port "$port" --max-restarts 0 \
        "$(dirname "$0")/fsdp2.py" "$base/node$node" --remote "$remote" "$@" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=$?
done
exit "$status"
