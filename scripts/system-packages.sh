#!/usr/bin/env bash
# Installs the Debian packages named as arguments when their command is missing.
# As root it uses apt-get; otherwise it prints one line saying what to install and fails.
set -euo pipefail
declare -A command_of=([mosquitto]=mosquitto [redis-server]=redis-server [openjdk-17-jre-headless]=java)
missing=()
for package in "$@"; do
  command -v "${command_of[$package]:-$package}" >/dev/null 2>&1 || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "missing system packages: please install ${missing[*]} (e.g. sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
