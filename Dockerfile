# leaderd: a static binary on distroless, non-root, read-only-root friendly.
# Build: docker build -t leaderd:0.1.0 .
FROM rust:1.95-slim-bookworm AS build
# musl-tools compiles the bundled SQLite for the static musl target.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates crates
COPY migrations migrations
COPY tests tests
RUN cargo build --release --locked -p leaderd --target x86_64-unknown-linux-musl \
 && install -D target/x86_64-unknown-linux-musl/release/leaderd /out/leaderd

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/leaderd /usr/local/bin/leaderd
# 65532 is distroless's "nonroot"; nothing is written outside mounted volumes.
USER 65532:65532
EXPOSE 4040
ENTRYPOINT ["/usr/local/bin/leaderd"]
CMD ["run"]
