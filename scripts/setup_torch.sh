#!/usr/bin/env bash
# Prepare .venv-torch: a separate venv with PyTorch (CPU) for the end-to-end
# DataLoader test (tests/privileged/test_torch.py), plus iotrace itself installed
# editable so the trainer can import tracer.marker and tracer.integrations.torch.
#
# Made from /usr/bin/python3 with --system-site-packages, as .venv is: torch
# pins nothing that Debian's numpy breaks, and the trainer needs no bcc.  The
# torch requirement is pinned to the CPU build that lies on this machine's
# disk; an unpinned torch would fetch a multi-GB CUDA build.  Idempotent: a
# stamp holds a hash of what was installed, so a run on a ready machine prints
# nothing and takes a few milliseconds.
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
REPO=$(pwd -P)
VENV=$REPO/.venv-torch
STAMP=$VENV/.iotrace-torch-installed
TORCH_REQUIREMENT='torch==2.13.0'
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1

say() { echo "setup-torch: $*"; }

# shellcheck source=scripts/lib.sh
source "$REPO/scripts/lib.sh"

want=$( { /usr/bin/python3 --version; cat "${BASH_SOURCE[0]}"; } | sha256sum | cut -d' ' -f1)
if [[ -x $VENV/bin/python && $(cat "$STAMP" 2>/dev/null) == "$want" ]]; then
    exit 0
fi

if [[ ! -x $VENV/bin/python ]] || ! grep -qsx 'home = /usr/bin' "$VENV/pyvenv.cfg" \
        || ! grep -qsx 'include-system-site-packages = true' "$VENV/pyvenv.cfg"; then
    say "create $VENV (/usr/bin/python3, --system-site-packages)"
    rm -rf "$VENV"
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
start=$SECONDS
say "pip install $TORCH_REQUIREMENT (CPU) into $VENV"
quiet "$VENV/bin/python" -m pip install "$TORCH_REQUIREMENT"
quiet "$VENV/bin/python" -m pip install -e .
# Fail here, not in the test, if the install cannot import.
quiet "$VENV/bin/python" -c 'import torch, torch.utils.data, tracer.marker'
say "done in $((SECONDS - start))s"
echo "$want" >"$STAMP"
