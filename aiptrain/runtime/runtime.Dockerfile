# An aiptrain runtime image: the base image's Python plus a runtime version's frameworks,
# installed from a wheelhouse the host downloaded (the build needs no network).
# Two stages keep the wheelhouse out of the final image (no BuildKit needed).
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS install
# Labelled so the builder can delete this stage (and its copy of the wheelhouse) afterwards.
LABEL aiptrain.build-stage=install
COPY wheelhouse /wheelhouse
RUN if [ -s /wheelhouse/requirements.txt ]; then \
      python3 -m pip install --no-index --find-links /wheelhouse --target /install \
        --no-cache-dir --disable-pip-version-check --no-warn-script-location --break-system-packages \
        -r /wheelhouse/requirements.txt; \
    fi; mkdir -p /install/bin

FROM ${BASE_IMAGE}
ARG PYTHON_SITE
ARG RUNTIME_VERSION
COPY --from=install /install ${PYTHON_SITE}
ENV PATH=/usr/local/bin:${PYTHON_SITE}/bin:/usr/bin:/bin \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    LANG=C.UTF-8
LABEL aiptrain.runtime-version=${RUNTIME_VERSION}
