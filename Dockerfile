# Two images from one file; `make image` builds both with podman (stack/image.sh), and CI runs them
# on a real Kubernetes in `make test-kubernetes`:
#   podman build --target services -t mailqueue .        five entry points: python -m enqueue_svc |
#                                                        dequeue_svc | browse_svc | blob_svc | webhook_svc
#   podman build --target sweep -t mailqueue-sweep .     the retention sweep: python -m spark.sweep
#                                                        (adds a Java 17 runtime, pyspark and the
#                                                        Spark Cassandra Connector jars)
# Each stage installs what changes rarely (the code generator; Java and pyspark) before the
# project's own files, so a change of the code rebuilds only the layers after them.
FROM python:3.11-slim AS build
WORKDIR /src
COPY constraints.txt ./
RUN pip install --no-cache-dir -c constraints.txt grpcio-tools
COPY pyproject.toml ./
COPY protos protos
COPY services services
COPY enqueue_svc enqueue_svc
COPY dequeue_svc dequeue_svc
COPY browse_svc browse_svc
COPY blob_svc blob_svc
COPY webhook_svc webhook_svc
COPY mailq mailq
COPY spark spark
RUN python -m services.contract.codegen --tree \
 && pip wheel --no-cache-dir -c constraints.txt --wheel-dir /wheels .

# The connector and its dependencies from Maven Central (the 3.5.x assembly jar is not published there).
FROM maven:3.9-eclipse-temurin-17 AS jars
COPY spark/pom.xml /spark/pom.xml
RUN mvn -B -q -f /spark/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=/jars

FROM python:3.11-slim AS services
RUN useradd --uid 10001 --user-group --no-create-home mailqueue
COPY --from=build /wheels /wheels
COPY constraints.txt /tmp/constraints.txt
RUN pip install --no-cache-dir -c /tmp/constraints.txt /wheels/*.whl && rm -rf /wheels /tmp/constraints.txt
USER 10001:10001
ENV PYTHONUNBUFFERED=1 MAILQUEUE_HOST=0.0.0.0
EXPOSE 50051 50052 50053 50054 50055
CMD ["python", "-m", "enqueue_svc"]

# The sweep's Java, pyspark and jars, apart from the code: kept from one build to the next.
FROM python:3.11-slim AS sweep-runtime
RUN useradd --uid 10001 --user-group --no-create-home mailqueue
COPY constraints.txt /tmp/constraints.txt
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/* \
 && pip install --no-cache-dir -c /tmp/constraints.txt pyspark && rm /tmp/constraints.txt
COPY --from=jars /jars /opt/mailqueue/spark-jars

FROM sweep-runtime AS sweep
COPY --from=build /wheels /wheels
COPY constraints.txt /tmp/constraints.txt
RUN pip install --no-cache-dir -c /tmp/constraints.txt /wheels/*.whl && rm -rf /wheels /tmp/constraints.txt
USER 10001:10001
ENV PYTHONUNBUFFERED=1 HOME=/tmp MAILQUEUE_SWEEP_SUMMARY=/tmp/sweep-summary.json
CMD ["python", "-m", "spark.sweep"]
