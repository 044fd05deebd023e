#!/usr/bin/env bash
# Installs the given Debian packages that are missing; silent when none are.
# Source it and call `dl_install_deps PKG...`, or run it as `install-deps.sh PKG...`.

dl_install_deps() {
  if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "install-deps: no dpkg-query (not Debian?); assuming $* are present" >&2
    return 0
  fi
  local pkg missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q ' installed$' || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0

  local sudo=()
  [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  echo "install-deps: installing ${missing[*]}" >&2
  "${sudo[@]}" apt-get update -qq
  # env, not a prefix assignment, so the variable survives sudo.
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  dl_install_deps "$@"
fi
