#!/usr/bin/env bash
# srun for tools/slurm_{train,test}.sh: slurm_srun.sh PARTITION JOB_NAME SCRIPT.py [script args]
# Env: GPUS (tasks, default 8), GPUS_PER_NODE (default 8; 0 = CPU nodes, gloo backend),
# CPUS_PER_TASK (default 5), SRUN_ARGS (extra srun options), PYTHON.
set -euo pipefail
PARTITION=$1
JOB_NAME=$2
SCRIPT=$3
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
GRES=()
if [ "$GPUS_PER_NODE" -gt 0 ]; then GRES=(--gres="gpu:$GPUS_PER_NODE"); fi
TASKS_PER_NODE=$(( GPUS_PER_NODE > 0 ? GPUS_PER_NODE : GPUS ))

# shellcheck disable=SC2086  # SRUN_ARGS is a list of options
PYTHONPATH="$(dirname "$0")/..":${PYTHONPATH:-} \
srun -p "$PARTITION" --job-name="$JOB_NAME" "${GRES[@]}" --ntasks="$GPUS" \
    --ntasks-per-node="$TASKS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" --kill-on-bad-exit=1 \
    ${SRUN_ARGS:-} \
    "${PYTHON:-python}" -u "$(dirname "$0")/$SCRIPT" "${@:4}" --launcher slurm
