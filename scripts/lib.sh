# Shell helpers shared by scripts/setup.sh and scripts/setup_tf.sh (sourced, not run).

# Run a command with its output hidden, shown only if it fails.
quiet() {
    local log rc=0
    log=$(mktemp)
    "$@" >"$log" 2>&1 || rc=$?
    ((rc == 0)) || cat "$log" >&2
    rm -f "$log"
    return "$rc"
}
