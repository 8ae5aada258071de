#!/usr/bin/env bash
# Training on a Slurm cluster, one task per GPU (GPUS, GPUS_PER_NODE, ...: see slurm_srun.sh):
#   GPUS=16 tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args]
exec "$(dirname "$0")/slurm_srun.sh" "$1" "$2" train.py "$3" --work-dir="$4" "${@:5}"
