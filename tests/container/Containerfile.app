# The stand-in app of the container tests (tests/container/app.py), built
# the way docs/kubernetes.md tells an app to carry leaderd: the binary copied
# from leaderd's image, for the app's preStop `leaderd release`.
ARG BASE
ARG LEADERD
FROM ${LEADERD} AS leaderd

FROM ${BASE}
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=leaderd /usr/local/bin/leaderd /usr/local/bin/leaderd
COPY app.py /app/app.py
USER 65532:65532
ENTRYPOINT ["python3", "/app/app.py"]
