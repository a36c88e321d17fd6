#!/usr/bin/env bash
# Installs the Debian packages named as arguments when their command is missing.
# As root it uses apt-get, after one line naming the packages it installs; otherwise it
# prints one line saying what to install (or to run make test-no-system) and fails.
set -euo pipefail
declare -A command_of=([mosquitto]=mosquitto [redis-server]=redis-server [openjdk-17-jre-headless]=java
  [mariadb-server]=mariadbd [graphite-carbon]=carbon-cache [iproute2]=tc)
PATH="$PATH:/usr/sbin:/sbin"  # mariadbd is there, off a user's PATH

# postgresql's server is off PATH too, in /usr/lib/postgresql/NN/bin (where the tests look).
installed() {
  case "$1" in
    postgresql) compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || command -v postgres >/dev/null 2>&1 ;;
    *) command -v "${command_of[$1]:-$1}" >/dev/null 2>&1 ;;
  esac
}

missing=()
for package in "$@"; do
  installed "$package" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "system-packages: installing ${missing[*]} with apt-get (make test-no-system runs the tests without them)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "missing system packages: please install ${missing[*]} (e.g. sudo apt-get install ${missing[*]}), or run make test-no-system, which skips the tests that need them" >&2
  exit 1
fi
