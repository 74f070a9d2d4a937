# gleanrl: the trainer, the embedded rollout server (compose profile `cpu`) and the demo.
#   docker build -t gleanrl .                     (CPU torch)
#   docker build -t gleanrl --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .   (CUDA torch)
# The GPU rollout server is stock SGLang's own image (see docker-compose.yml), not this one.
FROM python:3.11-slim
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false GLEANRL_CACHE=/cache
WORKDIR /opt/gleanrl
RUN pip install --no-cache-dir torch==2.13.0 --index-url "${TORCH_INDEX_URL}"
COPY pyproject.toml README.md ./
COPY scripts/constraints.txt scripts/
COPY gleanrl/ gleanrl/
COPY server/ server/
COPY harvest/ harvest/
COPY trainer/ trainer/
COPY clients/ clients/
# one installed package, gleanrl (the component folders are mapped into it by pyproject.toml; non-editable),
# with the versions CI tests (scripts/constraints.txt)
RUN pip install --no-cache-dir -c scripts/constraints.txt . \
 && useradd --create-home --uid 1000 gleanrl \
 && mkdir -p /ckpt /cache && chown gleanrl:gleanrl /ckpt /cache
USER gleanrl
ENTRYPOINT ["gleanrl"]
CMD ["--help"]
