# leaderd: one binary linked against glibc, on a distroless "cc" base (glibc,
# libgcc and a few C/C++ runtime libraries leaderd does not use, CA
# certificates, time zone data; no shell, no package manager), user 65532,
# nothing written outside mounted volumes (runs with a read-only root).
#
#   podman build -t leaderd:0.1.0 .        (or docker build)
#
# Both bases are build arguments pinned by digest: a tag can move, a digest
# cannot. To update one, resolve the tag's current digest (for example
# `skopeo inspect docker://docker.io/library/rust:1.95.0-slim-bookworm`) and
# change tag and digest together. scripts/image builds this file with bases
# made from Debian's packages instead (where no registry is reachable),
# passed as BUILDER and RUNTIME; nothing else differs.
ARG BUILDER=docker.io/library/rust:1.95.0-slim-bookworm@sha256:d7482085ff5b415f84dba5647ae71606650bdef00db7aeb69f4b3d170c3e4082
ARG RUNTIME=gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f

# Why glibc, dynamically linked, rather than a static binary:
# - name resolution: a statically linked glibc still loads the NSS modules
#   that /etc/nsswitch.conf names, and crashes doing so (measured: SIGSEGV
#   on a host whose hosts: line names myhostname). Dynamically linked, a
#   database reached by host name resolves through /etc/hosts and DNS here,
#   and through whatever the host configures where the release binary runs;
# - a static musl build could not be built and tested where this project is
#   tested, and would bring musl's allocator, which no benchmark here has
#   measured; glibc's is the one every test and benchmark ran with;
# - TLS roots: rustls reads the base's /etc/ssl/certs/ca-certificates.crt
#   (SSL_CERT_FILE overrides it); nothing links OpenSSL;
# - time zones: leaderd prints UTC only and reads no zone data (the base
#   carries it all the same).
# The cost: the binary needs glibc 2.34 or later wherever it runs (the
# release tarball is this same binary; docs/getting-started.md).
FROM ${BUILDER} AS build
ENV CARGO_HOME=/usr/local/cargo
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates crates
COPY migrations migrations
COPY tests tests
# The cache mounts keep crates and the release build between builds; the
# binary leaves them through /out.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p leaderd \
 && install -D target/release/leaderd /out/leaderd \
 && /out/leaderd --version

FROM ${RUNTIME}
COPY --from=build /out/leaderd /usr/local/bin/leaderd
COPY LICENSE /usr/share/doc/leaderd/LICENSE
# 65532 is distroless's "nonroot".
USER 65532:65532
EXPOSE 4040
ENTRYPOINT ["/usr/local/bin/leaderd"]
CMD ["run"]
