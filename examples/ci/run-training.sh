#!/usr/bin/env bash
# One CI step: submit a training job with aiptrain, stream its logs until it ends, keep the job's
# resource (`jobs describe --format json`) and its logs as artifacts, and fail when the job fails.
# The GitHub Actions and GitLab CI examples beside this file both run it.
#
#   usage: examples/ci/run-training.sh [JOB_ID] [-- TRAINER_ARGS...]
#   environment (all optional):
#     AIPTRAIN         the command to run aiptrain       (default: aiptrain)
#     PACKAGE_PATH     the trainer package               (default: sample_jobs/basic/trainer)
#     MODULE_NAME      the module to run                 (default: trainer.task)
#     RUNTIME_VERSION  the runtime image                 (default: aiptrain's default runtime)
#     REGION           recorded on the job               (default: us-central1)
#     ARTIFACTS_DIR    where job.json, job.log and the job dir go (default: artifacts)
# Exit status: aiptrain's (0 the job succeeded, 1 it failed or was cancelled, 2 bad input,
# 3 environment not ready: Docker or an image missing).
set -uo pipefail

aiptrain=${AIPTRAIN:-aiptrain}
run_id=${GITHUB_RUN_ID:-${CI_PIPELINE_ID:-$(date +%s)}}
attempt=${GITHUB_RUN_ATTEMPT:-${CI_JOB_ID:-1}}
job_id=ci_${run_id}_${attempt}
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  job_id=$1
  shift
fi
[ "${1:-}" = "--" ] && shift
artifacts=${ARTIFACTS_DIR:-artifacts}
mkdir -p "$artifacts"

runtime=()
[ -n "${RUNTIME_VERSION:-}" ] && runtime=(--runtime-version "$RUNTIME_VERSION")

# Logs stream to stderr while the job runs; the job's final state goes to stdout.
$aiptrain jobs submit training "$job_id" \
  --package-path "${PACKAGE_PATH:-sample_jobs/basic/trainer}" \
  --module-name "${MODULE_NAME:-trainer.task}" \
  --job-dir "$(cd "$artifacts" && pwd)/job-dir" \
  --region "${REGION:-us-central1}" \
  "${runtime[@]}" \
  --labels "ci=true" \
  --stream-logs \
  -- "$@"
status=$?

# Artifacts, whatever happened (a refused submit leaves no job: nothing to keep).
if $aiptrain jobs describe "$job_id" --format json > "$artifacts/job.json" 2>/dev/null; then
  $aiptrain jobs stream-logs "$job_id" > "$artifacts/job.log"
  echo "Kept $artifacts/job.json and $artifacts/job.log." >&2
else
  rm -f "$artifacts/job.json"
fi
exit "$status"
