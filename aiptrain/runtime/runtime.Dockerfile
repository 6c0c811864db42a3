# An aiptrain runtime image: the base image's Python plus a runtime version's frameworks,
# installed from a wheelhouse the host downloaded (the build needs no network).
# Two stages keep the wheelhouse out of the final image (no BuildKit needed).
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS install
# Labelled so the builder can delete this stage (and its copy of the wheelhouse) afterwards.
LABEL aiptrain.build-stage=install
COPY wheelhouse /wheelhouse
# An environment variable, not --break-system-packages: bullseye's pip 20.3 has no such flag.
RUN if [ -s /wheelhouse/requirements.txt ]; then \
      PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-index --find-links /wheelhouse --target /install \
        --no-cache-dir --disable-pip-version-check --no-warn-script-location \
        -r /wheelhouse/requirements.txt || exit 1; \
    fi; mkdir -p /install/bin
# aiptrain_compat and its .pth line where the runtime gives names back to its trainers; else empty.
COPY compat /install/

FROM ${BASE_IMAGE}
ARG PYTHON_SITE
ARG RUNTIME_VERSION
ARG BASE_NAME
ARG PYTHON_VERSION
COPY --from=install /install ${PYTHON_SITE}
ENV PATH=/usr/local/bin:${PYTHON_SITE}/bin:/usr/bin:/bin \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    LANG=C.UTF-8
# Every module trainers import from the image imports (a missing system library such as
# libgomp for XGBoost fails the build, not a job); -B writes no bytecode into the image.
ARG IMPORTS
RUN if [ -n "$IMPORTS" ]; then python3 -B -c "import $IMPORTS" || exit 1; fi
# Every name aiptrain_compat gives back resolves in the releases installed.
ARG COMPAT
RUN if [ -n "$COMPAT" ]; then python3 -B -m aiptrain_compat $COMPAT || exit 1; fi
# What the image runs: submit resolves the trainer's dependencies for this Python.
LABEL aiptrain.runtime-version=${RUNTIME_VERSION} aiptrain.base=${BASE_NAME} aiptrain.python=${PYTHON_VERSION}
