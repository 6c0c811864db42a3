# A built-in algorithm's image (gcr.io/cloud-ml-algos/...): a runtime image (TensorFlow, XGBoost,
# cloudml-hypertune, gcsfs) plus aiptrain's trainers, built offline; the algorithm's flags reach
# its ENTRYPOINT as the job's args, with --job-dir.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG ALGORITHM
ARG RUNTIME_VERSION
COPY aiptrain_algorithms /opt/aiptrain-algorithms/aiptrain_algorithms
ENV PYTHONPATH=/opt/aiptrain-algorithms \
    AIPTRAIN_ALGORITHM=${ALGORITHM} \
    AIPTRAIN_RUNTIME_VERSION=${RUNTIME_VERSION} \
    TF_CPP_MIN_LOG_LEVEL=2 \
    PYTHONWARNINGS=ignore::FutureWarning
# The trainer's modules compile and import on the image's Python (a release it lacks fails the
# build, not a job); compiled now, since replicas run on a read-only file system.
ARG IMPORTS
RUN python3 -m compileall -q /opt/aiptrain-algorithms && python3 -c "import $IMPORTS" || exit 1
ENTRYPOINT ["python3", "-m", "aiptrain_algorithms"]
