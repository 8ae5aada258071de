#!/usr/bin/env bash
# Testing on a Slurm cluster, one task per GPU (GPUS, GPUS_PER_NODE, ...: see slurm_srun.sh):
#   GPUS=8 tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args, e.g. --reparam]
exec "$(dirname "$0")/slurm_srun.sh" "$1" "$2" test.py "$3" "$4" "${@:5}"
