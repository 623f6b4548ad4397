#!/usr/bin/env bash
# Installs the Debian packages the sandbox node, the console's browser tests, the
# deployment recipe's test and the install itself (the group commit's C extension,
# storage/_batch.c) need, only when one is missing.
# Idempotent; never fails the build: without root or apt-get it prints a warning,
# and the node's health endpoint reports the missing isolation layer instead.
set -u

# command that proves the package is present -> Debian package providing it
declare -A NEEDED=(
    [bwrap]=bubblewrap      # namespaces, read-only filesystem view
    [unshare]=util-linux    # fallback when bwrap cannot be used
    [setpriv]=util-linux
    [chromium]=chromium     # console browser tests (Playwright drives it; nothing downloaded)
    [haproxy]=haproxy       # scripts/deploy/haproxy.cfg, run by tests/scaleout/test_deployment_recipe.py
    [gcc]=gcc               # builds storage/_batch.c at install
)
# Libraries and headers, not commands: checked through dpkg.
LIBS=(libseccomp2 libsqlite3-dev)  # libsqlite3-dev: sqlite3.h for storage/_batch.c

missing=()
for cmd in "${!NEEDED[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEEDED[$cmd]}")
done
for lib in "${LIBS[@]}"; do
    dpkg-query -W -f='${Status}' "$lib" 2>/dev/null | grep -q 'install ok installed' \
        || missing+=("$lib")
done
# de-duplicate (util-linux can be listed twice)
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u | sed '/^$/d')

if [ "${#missing[@]}" -eq 0 ]; then
    echo "system-deps: all present (bubblewrap, util-linux, libseccomp2, chromium, haproxy, gcc, libsqlite3-dev)"
    exit 0
fi

echo "system-deps: missing: ${missing[*]}"
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "system-deps: WARNING: not root or no apt-get; install them by hand:" \
         "apt-get install ${missing[*]}" >&2
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
if apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
   || { apt-get update -qq >/dev/null 2>&1 \
        && apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1; }; then
    echo "system-deps: installed: ${missing[*]}"
else
    echo "system-deps: WARNING: apt-get could not install: ${missing[*]}" >&2
fi
exit 0
