# syntax=docker/dockerfile:1
# parallab's images, from one file (docs/deploy.md):
#   docker build --target api        -t parallab .       # API + migrations, CPU torch
#   docker build --target worker-cpu -t parallab-cpu .   # a worker for a host without GPUs
#   docker build --target worker-gpu -t parallab-gpu .   # a worker with CUDA torch (NCCL)
# docker compose builds all three (docker-compose.yml). Every image runs as the non-root user
# `parallab` (uid 10001) and keeps its state under /data (PARALLAB_HOME, a volume).

ARG PYTHON_VERSION=3.11
ARG TORCH_VERSION=2.13.0

# ---- base: Python, the user, /data -----------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PARALLAB_HOME=/data
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin parallab \
    && mkdir -p /data \
    && chown parallab:parallab /data
WORKDIR /home/parallab

# ---- wheels: parallab and its dependencies, built once, torch aside ---------------------------
FROM base AS wheels
WORKDIR /src
COPY pyproject.toml README.md ./
COPY parallab ./parallab
COPY backend ./backend
COPY workers ./workers
COPY frontend ./frontend
COPY migrations ./migrations
# torch is installed per target from its own index; the rest of the dependencies come from PyPI.
RUN pip wheel --wheel-dir /wheels --no-deps . \
    && python -c "import tomllib; d = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
print('\n'.join(x for x in d if not x.startswith('torch')))" > /wheels/requirements.txt \
    && pip wheel --wheel-dir /wheels -r /wheels/requirements.txt

# ---- cpu: CPU torch from PyTorch's CPU index, then parallab -----------------------------------
FROM base AS cpu
ARG TORCH_VERSION
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --index-url ${TORCH_CPU_INDEX} torch==${TORCH_VERSION} \
    && pip install --no-index --find-links /wheels parallab
USER parallab

# The API (uvicorn; compose sets --workers) and the one-shot `parallab db upgrade`.
FROM cpu AS api
EXPOSE 8000
CMD ["uvicorn", "backend.api.app:app", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]

# A worker on a host without GPUs (pool `cpu` unless PARALLAB_POOL says).
FROM cpu AS worker-cpu
CMD ["parallab", "worker"]

# ---- worker-gpu: a CUDA build of torch (its wheels carry CUDA, cuDNN and NCCL) ----------------
# The host needs the NVIDIA driver and the NVIDIA Container Toolkit; pick the CUDA index that the
# driver supports (`nvidia-smi` prints the highest CUDA version), e.g. cu126, cu128, cu130.
FROM base AS worker-gpu
ARG TORCH_VERSION
ARG TORCH_CUDA_INDEX=https://download.pytorch.org/whl/cu128
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --index-url ${TORCH_CUDA_INDEX} torch==${TORCH_VERSION} \
    && pip install --no-index --find-links /wheels parallab
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER parallab
CMD ["parallab", "worker"]
