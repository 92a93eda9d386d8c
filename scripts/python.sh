# shellcheck shell=bash
# Sourced by scripts/test and scripts/demo: find Python >= 3.12, then make sure the
# project's virtualenv (.venv in the project root) exists and has
# `pip install -e ".[dev,example,docs]"` of the current pyproject.toml (the example extra
# is what example_project/ needs: scripts/demo runs it, scripts/test tests it; the docs
# extra builds the documentation site, which scripts/test does). Afterwards
# $ROOT is the project root, $VENV the virtualenv, $PY its python, and $VENV/bin is first
# on PATH. _dbw_mysqlclient installs the MariaDB/MySQL driver when a script needs it.
#
# The interpreter is looked for in this order: $PYTHON; python3.14/3.13/3.12, python3 and
# python on PATH; pyenv's installs ($(pyenv root)/versions/3.1[2-9]*). Set PYTHON to choose.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
MIN_PYTHON="3.12"
_DBW_EXTRAS="dev,example,docs"

_dbw_say() { printf '%s\n' "$*" >&2; }

# True if "$1" runs and is a Python >= 3.12 (pyenv shims for versions that are not
# selected exist on PATH but fail when run, so every candidate is run once).
_dbw_good_python() {
    [ -n "$1" ] || return 1
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1
}

_dbw_find_python() {
    local candidate root
    if [ -n "${PYTHON:-}" ]; then
        if _dbw_good_python "$PYTHON"; then
            printf '%s\n' "$PYTHON"
            return 0
        fi
        _dbw_say "error: PYTHON=$PYTHON is not a working Python >= $MIN_PYTHON."
        return 1
    fi
    for candidate in python3.14 python3.13 python3.12 python3 python; do
        if command -v "$candidate" >/dev/null 2>&1 && _dbw_good_python "$candidate"; then
            command -v "$candidate"
            return 0
        fi
    done
    if command -v pyenv >/dev/null 2>&1; then
        root="$(pyenv root 2>/dev/null || true)"
    fi
    root="${root:-${PYENV_ROOT:-$HOME/.pyenv}}"
    # Newest first: 3.13.0 before 3.12.1.
    while IFS= read -r candidate; do
        if _dbw_good_python "$candidate"; then
            printf '%s\n' "$candidate"
            return 0
        fi
    done < <(ls -d "$root"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -V -r)
    cat >&2 <<EOF
error: no Python >= $MIN_PYTHON found.
  Looked at: \$PYTHON (unset), python3.14/python3.13/python3.12/python3/python on PATH,
  and pyenv installs under $root/versions/.
  Install one (e.g. 'pyenv install 3.13' or your system's python3.13 package),
  or point PYTHON at it: PYTHON=/path/to/python3.13 $0
EOF
    return 1
}

# True if $VENV is a working virtualenv of a Python >= 3.12 that was made at $VENV (one
# copied from another checkout has scripts and an editable install pointing there).
_dbw_venv_ok() {
    [ -x "$PY" ] && _dbw_good_python "$PY" || return 1
    local made
    made="$(sed -n 's/^command = .* -m venv //p' "$VENV/pyvenv.cfg" 2>/dev/null)"
    [ -z "$made" ] || [ "$made" = "$VENV" ]
}

# True if $PYTHON is unset, or the virtualenv was made from that same interpreter.
_dbw_venv_matches_python() {
    [ -n "${PYTHON:-}" ] || return 0
    local want have
    want="$("$PYTHON" -c 'import os, sys; print(os.path.realpath(sys.base_prefix), sys.version)' \
        2>/dev/null)" || return 1
    have="$("$PY" -c 'import os, sys; print(os.path.realpath(sys.base_prefix), sys.version)' \
        2>/dev/null)" || return 1
    [ "$want" = "$have" ]
}

_dbw_setup() {
    local base stamp wanted log
    if ! _dbw_venv_ok || ! _dbw_venv_matches_python; then
        base="$(_dbw_find_python)" || return 1
        _dbw_say "Creating $VENV with $("$base" -c 'import sys; print(sys.version.split()[0])') ($base) ..."
        rm -rf "$VENV"
        if ! "$base" -m venv "$VENV"; then
            _dbw_say "error: '$base -m venv $VENV' failed (see above)."
            return 1
        fi
    fi
    stamp="$VENV/.dbworker-installed"
    wanted="$("$PY" - "$ROOT/pyproject.toml" "$_DBW_EXTRAS" <<'EOF'
import hashlib, sys
print(hashlib.sha256(open(sys.argv[1], "rb").read() + sys.version.encode()
                     + sys.argv[2].encode()).hexdigest())
EOF
)" || return 1
    if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
        if [ -f "$stamp" ]; then
            _dbw_say "Installing django-dbworker[$_DBW_EXTRAS] into .venv (pyproject.toml" \
                "changed) ..."
        else
            _dbw_say "Installing django-dbworker[$_DBW_EXTRAS] into .venv ..."
        fi
        log="$VENV/pip-install.log"
        if ! (cd "$ROOT" && "$PY" -m pip install --disable-pip-version-check \
                -e ".[$_DBW_EXTRAS]") >"$log" 2>&1; then
            tail -n 40 "$log" >&2
            _dbw_say "error: 'pip install -e \".[$_DBW_EXTRAS]\"' failed; full log: $log"
            return 1
        fi
        printf '%s\n' "$wanted" >"$stamp"
    fi
}

# The MariaDB/MySQL driver, for scripts/test's MariaDB third and scripts/demo on mysql://:
# true once `import MySQLdb` works in $PY. mysqlclient (the `mysql` extra) has no Linux
# wheel: pip builds it against the client library's headers, found through pkg-config, so
# those (Debian's pkg-config and libmariadb-dev) are installed with apt-get first when they
# are missing and we are root. Not in the dev or example extras: scripts/demo on SQLite
# must not depend on a C build. $1: a folder for the install logs (default: $VENV).
_dbw_mysqlclient() {
    local logs="${1:-$VENV}"
    "$PY" -c "import MySQLdb" >/dev/null 2>&1 && return 0
    _dbw_say "Installing django-dbworker[mysql] (mysqlclient, the MariaDB/MySQL driver) into .venv ..."
    if ! pkg-config --exists libmariadb 2>/dev/null \
            && ! pkg-config --exists mysqlclient 2>/dev/null; then
        if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
            _dbw_say "  first pkg-config and libmariadb-dev with apt-get (mysqlclient is built against them) ..."
            if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
                    apt-get install -y -qq pkg-config libmariadb-dev) \
                    >"$logs/libmariadb-install.log" 2>&1; then
                tail -n 20 "$logs/libmariadb-install.log" >&2
                _dbw_say "warning: 'apt-get install pkg-config libmariadb-dev' failed (above)."
            fi
        else
            _dbw_say "warning: pkg-config or libmariadb-dev is missing and this is not root with" \
                "apt-get; mysqlclient will not build without them" \
                "(sudo apt-get install pkg-config libmariadb-dev)."
        fi
    fi
    if ! (cd "$ROOT" && "$PY" -m pip install --disable-pip-version-check -q -e ".[mysql]") \
            >"$logs/mysqlclient-install.log" 2>&1; then
        tail -n 20 "$logs/mysqlclient-install.log" >&2
        _dbw_say "error: 'pip install -e \".[mysql]\"' failed; full log: $logs/mysqlclient-install.log"
        return 1
    fi
    "$PY" -c "import MySQLdb" >/dev/null 2>&1
}

_dbw_setup || exit 1
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
unset PYTHONHOME
