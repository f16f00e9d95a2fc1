# leaderd: one statically linked binary on a distroless base, user 65532,
# nothing written outside mounted volumes (runs with a read-only root).
#
#   podman build -t leaderd:0.1.0 .        (or docker build)
#
# Both bases are build arguments pinned by digest: a tag can move, a digest
# cannot. To update one, resolve the tag's current digest (for example
# `skopeo inspect docker://rust:1.95.0-slim-bookworm`) and change tag and
# digest together. scripts/image builds this file with bases made from
# Debian's packages instead (where no registry is reachable), passing them as
# BUILDER and RUNTIME; nothing else differs.
ARG BUILDER=docker.io/library/rust:1.95.0-slim-bookworm@sha256:d7482085ff5b415f84dba5647ae71606650bdef00db7aeb69f4b3d170c3e4082
ARG RUNTIME=gcr.io/distroless/static-debian12:nonroot@sha256:d093aa3e30dbadd3efe1310db061a14da60299baff8450a17fe0ccc514a16639

# Why static glibc (not musl, not glibc on a "cc" base):
# - the allocator: musl's malloc is markedly slower under a multi-threaded
#   tokio load; glibc's is the one every test and benchmark ran with;
# - name resolution: glibc 2.36's static libc resolves through /etc/hosts and
#   DNS itself (the distroless base's nsswitch.conf asks for just those), so a
#   database reached by host name works with no shared libraries; NSS modules
#   such as mDNS or LDAP are not loaded (docs/getting-started.md);
# - TLS roots: rustls reads the base's /etc/ssl/certs/ca-certificates.crt
#   (SSL_CERT_FILE overrides it); nothing links OpenSSL;
# - time zones: leaderd prints UTC only, so no tzdata is read;
# - one binary for the image and the release tarball, which then runs on any
#   x86_64 Linux, whatever its libc.
# The static glibc target is the host's own (x86_64-unknown-linux-gnu), so no
# extra target or musl toolchain is needed; naming --target keeps crt-static
# away from build scripts and proc-macros.
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
    RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked -p leaderd --target x86_64-unknown-linux-gnu \
 && install -D target/x86_64-unknown-linux-gnu/release/leaderd /out/leaderd \
 && /out/leaderd --version

FROM ${RUNTIME}
COPY --from=build /out/leaderd /usr/local/bin/leaderd
# 65532 is distroless's "nonroot".
USER 65532:65532
EXPOSE 4040
ENTRYPOINT ["/usr/local/bin/leaderd"]
CMD ["run"]
