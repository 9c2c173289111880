#!/usr/bin/env bash
# Multi-process training with torchrun: tools/dist_train.sh CONFIG NPROC [train.py args]
# Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT. Without CUDA the processes train on
# CPUs (gloo). PYTHON overrides the interpreter (default: python).
set -euo pipefail
CONFIG=$1
NPROC=$2
shift 2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
PYTHON=${PYTHON:-python}
exec "$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$NPROC" --master_port="$PORT" \
    "$(dirname "$0")/train.py" "$CONFIG" --launcher pytorch "$@"
