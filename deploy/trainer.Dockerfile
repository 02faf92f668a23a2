# A trainer image with the spotagent client, installed from this checkout's
# python/ without PyPI (the client is pure standard-library Python; its build
# backend, python/spotagent_build.py, needs no setuptools or wheel from an
# index: `pip install --no-index` works offline).
#
#   docker build -f deploy/trainer.Dockerfile \
#     --build-arg BASE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime \
#     -t my-registry.example.com/my-trainer:v1 .
#   docker push my-registry.example.com/my-trainer:v1
#
# Built from the repository root (the context needs python/ and your training
# code). BASE is any image with python3 >= 3.8 and pip (your framework's
# image); it also needs sh, find and chown for the chart's copies init
# container (every Debian/Ubuntu-based image has them). The chart runs the
# trainer as uid 1000 (trainer.uid) and the agent's startup probe holds it
# until the restore is done. Not built in `make test` (no image builder here):
# docs/kubernetes.md, "Install".
ARG BASE=python:3.12-slim
FROM ${BASE}

# The client, from the checkout, never from an index.
COPY python/ /opt/spotagent-client/
RUN python3 -m pip install --no-index --no-cache-dir --no-build-isolation /opt/spotagent-client \
 && python3 -c "import spotagent" \
 && rm -rf /opt/spotagent-client

# Your training code (train.py, configs/): replace with your own COPY.
WORKDIR /workspace
COPY python/examples/ /workspace/

# The uid the chart runs trainer and sidecar as (trainer.uid); /workspace
# stays root's and read-only to it: checkpoints go where the agent says.
USER 1000:1000
ENTRYPOINT []
CMD ["python3", "train_ddp.py"]
