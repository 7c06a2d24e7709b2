#!/bin/sh
# Create the secrets docker-compose.yml mounts, beside it, each readable by the one container user
# that needs it and by nobody else:
#
#   pg_password  the PostgreSQL password, read by the postgres image's user (uid 999)   mode 0400
#   pgpass       the same password as a pgpass line for Plinth (uid 10001, the image's
#                `plinth` user; PGPASSFILE), which refuses a file others can read       mode 0400
#   secret.key   Plinth's secret key, 64 hex digits (uid 10001)                         mode 0400
#
# Docker Compose bind-mounts a file secret with the host file's owner and mode (compose's `uid`,
# `gid` and `mode` apply to Swarm only), so they are set here, on the host. Run as root in the
# directory of docker-compose.yml (or give it as $1). A file that exists is kept as it is, except
# its owner and mode: a secret key is never replaced (stored BMC passwords need it).
#
#   sudo docker/secrets.sh && docker compose up -d
set -eu
cd "${1:-$(dirname "$0")/..}"
PLINTH_UID=${PLINTH_UID:-10001}
POSTGRES_UID=${POSTGRES_UID:-999}
umask 077

new_password() { od -An -tx1 -N24 /dev/urandom | tr -d ' \n'; }

if [ ! -s pg_password ]; then
    new_password > pg_password
    echo "created pg_password"
fi
if [ ! -s pgpass ]; then
    # host:port:database:user:password, as in the compose file's PLINTH_DATABASE_URL.
    printf '127.0.0.1:5432:plinth:plinth:%s\n' "$(cat pg_password)" > pgpass
    echo "created pgpass"
fi
if [ ! -s secret.key ]; then
    od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > secret.key
    echo "created secret.key (back it up: without it stored BMC passwords cannot be read)"
fi

chown "$POSTGRES_UID:$POSTGRES_UID" pg_password
chown "$PLINTH_UID:$PLINTH_UID" pgpass secret.key
chmod 0400 pg_password pgpass secret.key
ls -ln pg_password pgpass secret.key
