# Builds the release binary and ships it on a slim Debian with the iPXE binaries and the capability
# to bind ports below 1024. DHCP (67), TFTP (69) and proxyDHCP (4011) need the host's LAN: run with
# host networking (see docker-compose.yml and docker/secrets.sh). tests/it/container.rs runs the
# built binary with exactly this file's ENV, USER, ENTRYPOINT and CMD (Docker is not needed for it).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto proto
COPY src src
COPY migrations migrations
COPY benches benches
RUN cargo build --release --locked --bin plinth

# The iPXE binaries: Debian's ipxe package of a suite that carries all four (BIOS, UEFI x86-64,
# snponly, UEFI ARM64), verified against the archive's signature by ipxe/fetch.sh.
FROM debian:bookworm-slim AS ipxe
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl gpgv \
        xz-utils dpkg debian-archive-keyring \
    && rm -rf /var/lib/apt/lists/*
COPY ipxe/fetch.sh /fetch.sh
RUN sh /fetch.sh --debian trixie,forky,sid /ipxe

FROM debian:bookworm-slim
# A fixed uid/gid (10001), so the host can give the secrets to it (docker/secrets.sh).
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libcap2-bin \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 plinth \
    && useradd --system --uid 10001 --gid 10001 --home /var/lib/plinth --create-home plinth
COPY --from=build /src/target/release/plinth /usr/local/bin/plinth
# Ports 67, 69 and 4011 as the non-root user: the file capability (the container must be allowed
# to keep it: compose's cap_add lists the same two).
RUN setcap cap_net_bind_service,cap_net_raw=+ep /usr/local/bin/plinth
COPY --from=ipxe /ipxe /usr/share/plinth/ipxe
COPY docker/plinth.toml /etc/plinth/plinth.toml
COPY plinth.example.toml /etc/plinth/plinth.example.toml
USER plinth
WORKDIR /var/lib/plinth
ENV PLINTH_CONFIG=/etc/plinth/plinth.toml
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/plinth"]
CMD ["serve"]
