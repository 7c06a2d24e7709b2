#!/usr/bin/env sh
# Create (or reuse) a Python venv holding the Redfish peers of the BMC tests: `sushy-emulator` and
# `sushy-static` from sushy-tools 2.2.0.
#
# Usage: tests/peers/redfish-venv.sh            # venv at $PLINTH_REDFISH_VENV or target/redfish-venv
#        PLINTH_REDFISH_VENV=/tmp/rf tests/peers/redfish-venv.sh
#
# Idempotent: a venv that already has the pinned version is left alone. The tests read the same
# variable (default `<crate root>/target/redfish-venv`).
set -eu

SUSHY_TOOLS_VERSION=2.2.0
root=$(CDPATH= cd -- "$(dirname -- "$0")/../.." && pwd)
venv=${PLINTH_REDFISH_VENV:-"$root/target/redfish-venv"}
python=${PYTHON:-python3}

if [ -x "$venv/bin/sushy-emulator" ] && [ -x "$venv/bin/sushy-static" ] \
    && "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('sushy-tools') != '$SUSHY_TOOLS_VERSION')" 2>/dev/null; then
    echo "redfish venv ready: $venv (sushy-tools $SUSHY_TOOLS_VERSION)"
    exit 0
fi

echo "creating redfish venv at $venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "sushy-tools==$SUSHY_TOOLS_VERSION"
"$venv/bin/sushy-emulator" --help >/dev/null
"$venv/bin/sushy-static" --help >/dev/null
echo "redfish venv ready: $venv (sushy-tools $SUSHY_TOOLS_VERSION)"
