# syntax=docker/dockerfile:1
# fleetcanary image: multi-stage, non-root, no compilers in the final stage. The image
# installs the wheel (the same artefact users install), built in the first stage from
# the sdist, with the commit it came from stamped in (fleetcanary version, build_info),
# and the Python packages of image/requirements-<FLAVOUR>.txt: == pins with hashes, torch
# included, the same lock files `make image` installs (scripts/build-image, docs/image.md,
# which builds these images without a Docker engine).
#   docker build --build-arg GIT_COMMIT=$(git rev-parse HEAD) -t fleetcanary:0.4.0-cpu .
#   docker build --build-arg GIT_COMMIT=$(git rev-parse HEAD) --build-arg FLAVOUR=cuda \
#                --build-arg PIP_EXTRA_INDEX_URL= -t fleetcanary:0.4.0 .
#   docker build --build-arg GIT_COMMIT=$(git rev-parse HEAD) --build-arg FLAVOUR=cuda12 \
#                --build-arg PIP_EXTRA_INDEX_URL= -t fleetcanary:0.4.0-cuda12 .
# FLAVOUR=cpu takes torch's CPU build from PIP_EXTRA_INDEX_URL (PyTorch's CPU index); FLAVOUR=cuda
# takes the CUDA 13.0 build from PyPI (driver R580+), FLAVOUR=cuda12 the CUDA 12.8 one (torch 2.10.0,
# driver R525+: R535, R550, R570 nodes; docs/image.md). The NVIDIA container runtime mounts the driver
# (libnvidia-ml, libcuda) at run time; the CUDA torch wheel brings its own CUDA runtime libraries.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG FLAVOUR=cpu
ARG EXTRAS=kube,gpu
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG GIT_COMMIT=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL}
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md LICENSE config.example.yaml ./
COPY image ./image
COPY exporter ./exporter
COPY probes ./probes
COPY alerts ./alerts
COPY dashboards ./dashboards
RUN python -m pip install "build>=1.2" \
 && FLEETCANARY_GIT_COMMIT="${GIT_COMMIT}" python -m build --wheel --outdir /dist . \
 && python -m venv /opt/fleetcanary \
 && /opt/fleetcanary/bin/pip install --require-hashes --no-deps --only-binary=:all: \
        -r "image/requirements-${FLAVOUR}.txt" \
 && wheel="$(ls /dist/fleetcanary-*.whl)" \
 && /opt/fleetcanary/bin/pip install "${wheel}[${EXTRAS}]" \
 && /opt/fleetcanary/bin/pip check

FROM ${PYTHON_IMAGE}
ARG GIT_COMMIT=""
ARG FLAVOUR=cpu
LABEL org.opencontainers.image.title="fleetcanary" \
      org.opencontainers.image.description="Prometheus exporter and canary benchmarker for GPU nodes" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/fleetcanary/fleetcanary" \
      org.opencontainers.image.revision="${GIT_COMMIT}" \
      io.fleetcanary.flavour="${FLAVOUR}"
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
