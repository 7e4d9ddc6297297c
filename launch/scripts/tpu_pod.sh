#!/usr/bin/env bash
# Runs the main job on every worker of a Cloud TPU VM pod slice.
#
# Expects: gcloud configured for the project; a TPU VM slice named $TPU_NAME in
# $ZONE (e.g. v4-32 or v5e-16); this repository cloned at $REPO_DIR on every
# worker (or pass REPO_URL to clone it) with `pip install -e '.[gcs]'` (gcsfs: the
# checkpoints go to the gs:// bucket $OUT) and jax[tpu].
# jax.distributed.initialize() auto-detects the TPU workers (--auto-distributed),
# so no coordinator address is needed. Extra arguments go to launch.train.
# Running the script again continues the run: --resume auto resumes from the
# newest valid checkpoint under $OUT, or starts fresh (one line says so). The
# run folder (metrics, loss curve, logs) is /tmp/shardopt-runs/<$OUT, each
# character other than A-Z a-z 0-9 . _ - as _> on each worker's own disk, one per
# bucket path, so a run for another $OUT never meets this one's metrics; process 0
# (worker 0) writes it.
#
#   TPU_NAME=my-pod ZONE=us-central2-b ./launch/scripts/tpu_pod.sh --mesh data=-1,model=4 --steps 2000
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
REPO_DIR="${REPO_DIR:-~/shardopt}"
OUT="${OUT:-gs://YOUR_BUCKET/shardopt-run}"   # every worker must see the same checkpoint dir

setup=""
if [[ -n "${REPO_URL:-}" ]]; then
  setup="[ -d ${REPO_DIR} ] || git clone ${REPO_URL} ${REPO_DIR};
         cd ${REPO_DIR} && pip install -q -e '.[gcs]' 'jax[tpu]' &&"
fi

RUN_DIR="/tmp/shardopt-runs/${OUT//[^A-Za-z0-9._-]/_}"

gcloud compute tpus tpu-vm ssh "${TPU_NAME}" --zone "${ZONE}" --worker=all --command "
  ${setup} cd ${REPO_DIR} && python3 -m launch.train --auto-distributed --cpu-devices 0 \
    --out $(printf '%q' "${RUN_DIR}") --checkpoint-dir $(printf '%q' "${OUT}/checkpoints") \
    --resume auto ${*:+$(printf '%q ' "$@")}"
