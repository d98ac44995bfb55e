#!/usr/bin/env bash
# Prints the path of a Python 3.12 or newer that runs (Django 6 needs 3.12+), for make and .ci/run to build .venv
# with. $PYTHON, when set, is the only candidate. Otherwise, first that runs: python3.13, python3.12 on PATH (a
# pyenv shim may be on PATH and still fail, so each is run, not just found), pyenv's own 3.13 and 3.12, then
# python3.13, python3.12, python3 in /usr/local/bin and /usr/bin. With none, says what to install and fails.
set -uo pipefail

good() { [ -n "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }

if [ -n "${PYTHON:-}" ]; then
  if good "$PYTHON"; then command -v "$PYTHON"; exit 0; fi
  printf 'PYTHON=%s is not a Python 3.12 or newer that runs (%s).\n' "$PYTHON" \
    "$("$PYTHON" --version 2>&1 | head -n 1 || true)" >&2
  exit 1
fi

candidates=()
for name in python3.13 python3.12; do
  path=$(command -v "$name" 2>/dev/null) && candidates+=("$path")
done
for root in "${PYENV_ROOT:-}" "${HOME:-}/.pyenv" /root/.pyenv; do
  [ -n "$root" ] || continue
  for path in "$root"/versions/3.13*/bin/python3.13 "$root"/versions/3.12*/bin/python3.12; do
    [ -x "$path" ] && candidates+=("$path")
  done
done
for dir in /usr/local/bin /usr/bin; do
  candidates+=("$dir/python3.13" "$dir/python3.12" "$dir/python3")
done

for path in "${candidates[@]}"; do
  if good "$path"; then echo "$path"; exit 0; fi
done

cat >&2 <<'EOF'
PAL Ops needs Python 3.12 or newer (Django 6), and none that runs was found: not python3.13 or python3.12 on
PATH, not in pyenv's versions, not in /usr/local/bin or /usr/bin. Install one, then run make again:

    Debian 13 (trixie) or Ubuntu 24.04:  sudo apt-get install python3 python3-venv
    anywhere, with pyenv:                pyenv install 3.13

or name one with PYTHON=/path/to/python3.13.
EOF
exit 1
