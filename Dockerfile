# syntax=docker/dockerfile:1
# fleetcanary image: multi-stage, non-root, no compilers in the final stage.
#   docker build -t fleetcanary:0.1.0 .
#   docker build --build-arg EXTRAS=kube,gpu --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 -t fleetcanary:0.1.0-cuda .
# The NVIDIA container runtime mounts the driver (libnvidia-ml, libcuda) at run time;
# the CUDA torch wheel brings its own CUDA runtime libraries.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG EXTRAS=kube
ARG TORCH_INDEX=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
COPY probes ./probes
RUN python -m venv /opt/fleetcanary \
 && /opt/fleetcanary/bin/pip install --upgrade pip \
 && if [ -n "$TORCH_INDEX" ]; then /opt/fleetcanary/bin/pip install --index-url "$TORCH_INDEX" torch; fi \
 && /opt/fleetcanary/bin/pip install ".[${EXTRAS}]"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="fleetcanary" \
      org.opencontainers.image.description="Prometheus exporter and canary benchmarker for GPU nodes" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/fleetcanary /opt/fleetcanary
COPY alerts /opt/fleetcanary/share/alerts
ENV PATH=/opt/fleetcanary/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FLEETCANARY_STATE_DIR=/var/lib/fleetcanary
RUN mkdir -p /var/lib/fleetcanary && chown 65532:65532 /var/lib/fleetcanary
USER 65532:65532
EXPOSE 9835
ENTRYPOINT ["fleetcanary"]
CMD ["run"]
