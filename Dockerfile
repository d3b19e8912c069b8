# The services' image: one image, four entry points (python -m enqueue_svc | dequeue_svc |
# browse_svc | blob_svc), plus the retention sweep (python -m spark.sweep).
# Built by CI/CD elsewhere (no Docker engine on the dev machines); keep it minimal.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml constraints.txt ./
COPY protos protos
COPY services services
COPY enqueue_svc enqueue_svc
COPY dequeue_svc dequeue_svc
COPY browse_svc browse_svc
COPY blob_svc blob_svc
COPY mailq mailq
RUN pip install --no-cache-dir -c constraints.txt grpcio-tools \
 && python -m services.codegen \
 && pip wheel --no-cache-dir -c constraints.txt --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 10001 --user-group --no-create-home mailqueue
COPY --from=build /wheels /wheels
COPY constraints.txt /tmp/constraints.txt
RUN pip install --no-cache-dir -c /tmp/constraints.txt /wheels/*.whl && rm -rf /wheels /tmp/constraints.txt
USER 10001:10001
ENV PYTHONUNBUFFERED=1 MAILQUEUE_HOST=0.0.0.0
EXPOSE 50051 50052 50053 50054
CMD ["python", "-m", "enqueue_svc"]
