#!/usr/bin/env bash
# Set up what pw_kernel needs on a fresh Debian machine: system packages (when
# missing), a virtual environment in .venv and the package with the extras asked for.
#
#   ./scripts/setup.sh [EXTRAS]   EXTRAS: comma-separated, default "notebook" (what run.sh needs);
#                                 test.sh asks for "notebook,test" (adds Ray, Playwright, pytest)
#
# Idempotent: a second run only checks; asking for more extras later installs just those.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-notebook}"

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        log "need root to run: $*"; return 1; fi
}

APT_UPDATED=0
apt_install() {
    command -v apt-get >/dev/null || { log "apt-get not found; install these yourself: $*"; return 1; }
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        as_root apt-get update -qq
        APT_UPDATED=1
    fi
    log "apt-get install $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# 1. A Python >= 3.11.
PY=""
for cand in ${PYTHON:-} python3.12 python3.11 python3 python; do
    if command -v "$cand" >/dev/null 2>&1 &&
        "$cand" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
        PY=$cand
        break
    fi
done
if [ -z "$PY" ]; then
    apt_install python3 python3-venv python3-pip
    PY=python3
fi

# 2. System packages: graphviz's `dot` renders program graphs; Debian's Chromium runs the browser
#    tests (driven by the Python playwright package, which downloads no browser of its own).
command -v dot >/dev/null || apt_install graphviz
case ",$EXTRAS," in
    *,test,*) [ -x /usr/bin/chromium ] || apt_install chromium ;;
esac

# 3. The virtual environment (Debian's python3 needs python3-venv for ensurepip).
if [ ! -x .venv/bin/python ]; then
    log "creating .venv with $($PY --version)"
    if ! "$PY" -m venv .venv 2>/dev/null; then
        rm -rf .venv
        ver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
        apt_install "python${ver}-venv" || apt_install python3-venv
        "$PY" -m venv .venv
    fi
fi

# 4. The package and its extras; one stamp per extras set, skipped while pyproject.toml is unchanged.
# A stamp for more extras covers fewer: after test.sh ("notebook,test"), run.sh ("notebook") installs nothing.
stamp=".venv/.pw_kernel-installed-${EXTRAS//,/-}"
covered() {
    local s have want
    for s in .venv/.pw_kernel-installed-*; do
        [ -f "$s" ] && [ ! pyproject.toml -nt "$s" ] || continue
        have="-${s#.venv/.pw_kernel-installed-}-"
        for want in ${EXTRAS//,/ }; do
            [[ "$have" == *"-$want-"* ]] || continue 2
        done
        return 0
    done
    return 1
}
if ! covered; then
    log "installing pw_kernel[$EXTRAS] into .venv (first time: a few minutes)"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[$EXTRAS]"
    touch "$stamp"
fi
# 5. Jupyter's event schemas ask for jsonschema's "format-nongpl" checkers, which bring rfc3987-syntax: an
#    unmaintained library that builds an Earley parser of the IRI grammar when imported, ~2 s of CPU in every
#    process that imports jsonschema: Ray does, so every Ray node's agents and every Ray worker paid it (a
#    local Ray head took 14 s to start here, 4.4 s without it), and the Jupyter server. It only checks the
#    "iri" format, which no schema installed here uses; without it jsonschema leaves that format unchecked
#    (`pip check` still finds nothing broken).
for lib in .venv/lib/python3*/site-packages/rfc3987_syntax; do
    [ -d "$lib" ] || continue
    log "removing rfc3987-syntax (~2 s of import in every Ray and Jupyter process; see scripts/setup.sh)"
    .venv/bin/python -m pip uninstall -q -y rfc3987-syntax
done
log "ready: $(.venv/bin/python -c 'import jax, pw_kernel; print(f"pw_kernel {pw_kernel.__version__}, jax {jax.__version__}")')"
