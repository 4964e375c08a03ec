#!/usr/bin/env bash
# Checks systemd/poimen-gateway.service offline (no running systemd needed):
#   1. `systemd-analyze verify`: any warning or error about the unit fails.
#   2. `systemd-analyze security --offline=true`: the overall exposure level
#      must be <= MAX_EXPOSURE (default 2.0).
#   3. systemd/poimen-gateway-reload parses as POSIX sh and is executable.
#   4. systemd/poimen-gateway.sysusers creates the user in a scratch root.
#   5. conf/gateway.yaml's pid_file is the unit's PIDFile=, and its
#      upgrade_sock lies in the unit's RuntimeDirectory=.
# verify wants the Exec*= binaries to exist, so it runs on a copy of the unit
# whose binary and reload script paths (the Debian package's: /usr/bin,
# /usr/lib/poimen-gateway) point at stub executables in a temporary directory.
# Installs the `systemd` package (it has systemd-analyze) if it is missing.
# Exit status: 0 when every check passes, 1 otherwise.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
unit="$root/systemd/poimen-gateway.service"
reload="$root/systemd/poimen-gateway-reload"
sysusers="$root/systemd/poimen-gateway.sysusers"
conf="$root/conf/gateway.yaml"
max_exposure=${MAX_EXPOSURE:-2.0}
bin_path=/usr/bin/poimen-gateway
reload_path=/usr/lib/poimen-gateway/reload

failed=0
fail() { echo "check-systemd: FAIL: $*" >&2; failed=1; }
ok() { echo "check-systemd: ok: $*"; }

if ! command -v systemd-analyze >/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "check-systemd: installing systemd (for systemd-analyze)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends systemd >/dev/null
fi
echo "check-systemd: $(systemd-analyze --version | head -n 1)"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/units"
printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/poimen-gateway"
printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/reload"
chmod 0755 "$tmp/bin/poimen-gateway" "$tmp/bin/reload"
copy="$tmp/units/poimen-gateway.service"
sed -e "s#$reload_path#$tmp/bin/reload#g" -e "s#$bin_path#$tmp/bin/poimen-gateway#g" "$unit" >"$copy"
# Any other executable path would be checked against this machine's files
# rather than against what the package installs.
if grep -nE '^Exec[A-Za-z]*=[-@:+!]*/usr/' "$copy"; then
  fail "an Exec*= line runs a program other than $bin_path or $reload_path"
fi

# 1. verify. It exits 0 on many warnings ("Unknown key", "Failed to parse ..."),
# so its output is what counts: a line naming the unit fails the check.
echo
echo "== systemd-analyze verify"
verify_rc=0
verify_out=$(cd "$tmp/units" && systemd-analyze verify --man=no "$copy" 2>&1) || verify_rc=$?
if [ -n "$verify_out" ]; then
  printf '%s\n' "$verify_out" | sed "s#$tmp/units/##g; s#$tmp/bin/#<stub>/#g"
fi
about_unit=$(printf '%s\n' "$verify_out" | grep -E "poimen-gateway|$tmp" || true)
if [ "$verify_rc" -ne 0 ]; then
  fail "systemd-analyze verify exited with status $verify_rc"
elif [ -n "$about_unit" ]; then
  fail "systemd-analyze verify printed warnings about the unit"
else
  [ -z "$verify_out" ] || echo "(the lines above do not concern poimen-gateway.service)"
  ok "systemd-analyze verify: no warnings"
fi

# 2. security exposure.
echo
echo "== systemd-analyze security --offline=true"
security_out=$(cd "$tmp/units" && systemd-analyze security --no-pager --offline=true "$copy" 2>&1) || true
printf '%s\n' "$security_out"
exposure=$(printf '%s\n' "$security_out" |
  sed -n 's/.*Overall exposure level for poimen-gateway\.service: \([0-9][0-9]*\(\.[0-9]*\)\{0,1\}\).*/\1/p' | tail -n 1)
if [ -z "$exposure" ]; then
  fail "no 'Overall exposure level' in the output of systemd-analyze security"
elif awk -v e="$exposure" -v m="$max_exposure" 'BEGIN { exit !(e + 0 <= m + 0) }'; then
  ok "exposure level $exposure <= $max_exposure"
else
  fail "exposure level $exposure > $max_exposure"
fi

# 3. the reload script.
echo
echo "== $(basename "$reload")"
if [ ! -x "$reload" ]; then
  fail "$reload is not executable"
elif ! sh -n "$reload"; then
  fail "$reload: sh -n reports a syntax error"
elif command -v dash >/dev/null && ! dash -n "$reload"; then
  fail "$reload: dash -n reports a syntax error"
else
  ok "$(basename "$reload"): executable, parses as sh"
fi

# 4. sysusers.
echo
echo "== $(basename "$sysusers")"
if command -v systemd-sysusers >/dev/null; then
  mkdir -p "$tmp/root/etc"
  touch "$tmp/root/etc/passwd" "$tmp/root/etc/group" "$tmp/root/etc/shadow" "$tmp/root/etc/gshadow"
  if systemd-sysusers --root="$tmp/root" "$sysusers" &&
    grep -q '^poimen-gateway:' "$tmp/root/etc/passwd" &&
    grep -q '^poimen-gateway:' "$tmp/root/etc/group"; then
    ok "systemd-sysusers creates user and group poimen-gateway: $(grep '^poimen-gateway:' "$tmp/root/etc/passwd")"
  else
    fail "systemd-sysusers did not create user and group poimen-gateway from $sysusers"
  fi
else
  echo "check-systemd: systemd-sysusers not found, skipped"
fi

# 5. the unit and the shipped configuration agree.
echo
echo "== unit vs $(basename "$conf")"
yaml_key() { sed -n "s/^$1:[[:space:]]*[\"']\{0,1\}\([^\"'#[:space:]]*\).*/\1/p" "$conf" | tail -n 1; }
unit_key() { sed -n "s/^$1=//p" "$unit" | tail -n 1; }
pid_file=$(yaml_key pid_file)
upgrade_sock=$(yaml_key upgrade_sock)
unit_pid=$(unit_key PIDFile)
runtime_dir=/run/$(unit_key RuntimeDirectory)
if [ "$pid_file" != "$unit_pid" ]; then
  fail "pid_file in conf/gateway.yaml ($pid_file) is not the unit's PIDFile= ($unit_pid)"
elif [ "$(dirname "$upgrade_sock")" != "$runtime_dir" ]; then
  fail "upgrade_sock in conf/gateway.yaml ($upgrade_sock) is not in the RuntimeDirectory ($runtime_dir)"
else
  ok "pid_file = PIDFile = $unit_pid; upgrade_sock $upgrade_sock in $runtime_dir"
fi

echo
if [ "$failed" -ne 0 ]; then
  echo "check-systemd: FAILED" >&2
  exit 1
fi
echo "check-systemd: all checks passed (exposure $exposure)"
