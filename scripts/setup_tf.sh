#!/usr/bin/env bash
# Prepare .venv-tf: a separate venv with TensorFlow (CPU) for the end-to-end
# training test (tests/privileged/test_tensorflow.py), plus iotrace itself installed
# editable without dependencies so the trainer can import tracer.marker and
# tracer.integrations.keras.
#
# Separate from .venv because that one sees Debian's site-packages (for bcc),
# whose numpy and friends would fight TensorFlow's pins; the trainer needs no
# bcc.  Idempotent: a stamp holds a hash of what was installed, so a run on a
# ready machine prints nothing and takes a few milliseconds.
set -euo pipefail

cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.."
REPO=$(pwd -P)
VENV=$REPO/.venv-tf
STAMP=$VENV/.iotrace-tf-installed
TF_REQUIREMENT='tensorflow-cpu==2.21.*'
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1

say() { echo "setup-tf: $*"; }

# shellcheck source=scripts/lib.sh
source "$REPO/scripts/lib.sh"

# What an install depends on: this script (with the requirement in it) and the interpreter.  Not
# pyproject.toml: the editable install maps the tracer package to this checkout, so nothing the
# trainer imports changes with the project's metadata, and --no-deps ignores its dependencies.
want=$( { /usr/bin/python3 --version; cat "${BASH_SOURCE[0]}"; } | sha256sum | cut -d' ' -f1)
if [[ -x $VENV/bin/python && $(cat "$STAMP" 2>/dev/null) == "$want" ]]; then
    exit 0
fi

if [[ ! -x $VENV/bin/python ]] || ! grep -qsx 'home = /usr/bin' "$VENV/pyvenv.cfg"; then
    say "create $VENV (/usr/bin/python3, no system site-packages)"
    rm -rf "$VENV"
    /usr/bin/python3 -m venv "$VENV"
fi
start=$SECONDS
say "pip install $TF_REQUIREMENT into $VENV (about 1.6 GB, a minute or two)"
quiet "$VENV/bin/python" -m pip install "$TF_REQUIREMENT"
quiet "$VENV/bin/python" -m pip install --no-deps -e .
# Fail here, not in the test, if the install cannot import.
quiet "$VENV/bin/python" -c 'import tensorflow, keras, tracer'
say "done in $((SECONDS - start))s"
echo "$want" >"$STAMP"
