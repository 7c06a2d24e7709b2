# Builds the release binary and ships it on a slim Debian. DHCP (67), TFTP (69) and proxyDHCP (4011)
# need the host's LAN: run with host networking (see docker-compose.yml).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY migrations migrations
COPY benches benches
COPY tests tests
RUN cargo build --release --locked --bin plinth

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home /var/lib/plinth --create-home plinth
COPY --from=build /src/target/release/plinth /usr/local/bin/plinth
COPY plinth.example.toml /etc/plinth/plinth.example.toml
USER plinth
WORKDIR /var/lib/plinth
ENV PLINTH_CONFIG=""
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/plinth"]
CMD ["serve", "--data-dir", "/var/lib/plinth"]
