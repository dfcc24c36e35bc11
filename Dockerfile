# syntax=docker/dockerfile:1
# fleetcanary image: multi-stage, non-root, no compilers in the final stage. The image
# installs the wheel (the same artefact users install), built in the first stage from
# the sdist, with the commit it came from stamped in (fleetcanary version, build_info).
#   docker build --build-arg GIT_COMMIT=$(git rev-parse HEAD) -t fleetcanary:0.2.0 .
#   docker build --build-arg GIT_COMMIT=$(git rev-parse HEAD) --build-arg EXTRAS=kube,gpu \
#                --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 -t fleetcanary:0.2.0-cuda .
# The NVIDIA container runtime mounts the driver (libnvidia-ml, libcuda) at run time;
# the CUDA torch wheel brings its own CUDA runtime libraries.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG EXTRAS=kube
ARG TORCH_INDEX=""
ARG GIT_COMMIT=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md LICENSE config.example.yaml ./
COPY exporter ./exporter
COPY probes ./probes
COPY alerts ./alerts
COPY dashboards ./dashboards
RUN python -m pip install "build>=1.2" \
 && FLEETCANARY_GIT_COMMIT="${GIT_COMMIT}" python -m build --wheel --outdir /dist . \
 && python -m venv /opt/fleetcanary \
 && /opt/fleetcanary/bin/pip install --upgrade pip \
 && if [ -n "$TORCH_INDEX" ]; then /opt/fleetcanary/bin/pip install --index-url "$TORCH_INDEX" torch; fi \
 && wheel="$(ls /dist/fleetcanary-*.whl)" \
 && /opt/fleetcanary/bin/pip install "${wheel}[${EXTRAS}]"

FROM ${PYTHON_IMAGE}
ARG GIT_COMMIT=""
LABEL org.opencontainers.image.title="fleetcanary" \
      org.opencontainers.image.description="Prometheus exporter and canary benchmarker for GPU nodes" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.revision="${GIT_COMMIT}"
COPY --from=build /opt/fleetcanary /opt/fleetcanary
ENV PATH=/opt/fleetcanary/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FLEETCANARY_STATE_DIR=/var/lib/fleetcanary
RUN mkdir -p /var/lib/fleetcanary && chown 65532:65532 /var/lib/fleetcanary
USER 65532:65532
EXPOSE 9835
ENTRYPOINT ["fleetcanary"]
CMD ["run"]
