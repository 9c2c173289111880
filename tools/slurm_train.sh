#!/usr/bin/env bash
# Training on a Slurm cluster (GPU nodes):
#   tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args]
# GPUS (total, default 8), GPUS_PER_NODE (default 8), CPUS_PER_TASK (default 5) and
# SRUN_ARGS (extra srun options) come from the environment.
set -euo pipefail
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-}
PYTHON=${PYTHON:-python}
# shellcheck disable=SC2086
exec srun -p "$PARTITION" --job-name="$JOB_NAME" --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 $SRUN_ARGS \
    "$PYTHON" -u "$(dirname "$0")/train.py" "$CONFIG" --work-dir="$WORK_DIR" \
    --launcher slurm "$@"
