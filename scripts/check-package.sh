#!/usr/bin/env bash
# Checks the Debian package that scripts/package.sh built, with no systemd
# running and without touching this machine's system (everything is
# installed into throw-away roots):
#   1. control: name, version (Cargo.toml's), architecture, Depends; the
#      conffiles are exactly /etc/poimen-gateway/gateway.yaml; postinst,
#      prerm and postrm are there, 0755, and parse as POSIX sh.
#   2. contents: exactly the expected files, with their modes, owned by root
#      (the archive holds the config 0644; installed it is 0640, see 6).
#   3. the binary is stripped (no .debug_* sections, no symbol table).
#   4. lintian: no tag but those debian/poimen-gateway.lintian-overrides
#      explains (installs lintian if it is missing).
#   5. `dpkg -x` into a scratch root: the packaged binary accepts the
#      packaged config (`-t -c`), and every program the unit runs is in the
#      package.
#   6. the life cycle, with dpkg installing chrootless into a scratch root
#      (the maintainer scripts run here with DPKG_ROOT set) and stub
#      systemctl / deb-systemd-invoke / deb-systemd-helper that log their
#      calls, as if systemd ran in that root:
#      first install (user created, config 0640 root:poimen-gateway, no
#      start, no enable), upgrade of a running service (the operator's edit
#      kept, daemon-reload then reload, never a stop or restart), upgrade of
#      a stopped one (no reload), a failed reload (a warning, the upgrade
#      completes), a changed conffile (the edit kept, the new one beside it),
#      remove (stopped, config kept), purge (config gone); then with no
#      systemd in the root (no systemctl call at all), and the adduser
#      fallback where systemd-sysusers is missing.
# Usage: check-package.sh [PACKAGE.deb]  (default: the newest in target/debian)
# Exit status: 0 when every check passes, 1 otherwise.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
deb=${1:-$(ls -t "$root"/target/debian/poimen-gateway_*.deb 2>/dev/null | head -n 1 || true)}
[ -n "$deb" ] && [ -f "$deb" ] || {
  echo "check-package: no package: run scripts/package.sh first" >&2
  exit 1
}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
arch=$(dpkg --print-architecture)
conf=/etc/poimen-gateway/gateway.yaml

failed=0
fail() { echo "check-package: FAIL: $*" >&2; failed=1; }
ok() { echo "check-package: ok: $*"; }

need=()
command -v lintian >/dev/null || need+=(lintian)
command -v readelf >/dev/null || need+=(binutils)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "check-package: installing ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "check-package: $(basename "$deb")"

# 1. control.
echo
echo "== control"
field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = poimen-gateway ] || fail "Package: $(field Package)"
[ "$(field Version)" = "$version-1" ] || fail "Version: $(field Version), expected $version-1 (Cargo.toml)"
[ "$(field Architecture)" = "$arch" ] || fail "Architecture: $(field Architecture), expected $arch"
depends=$(field Depends)
case ", $depends," in *", adduser,"* | *", adduser "*) ;; *) fail "Depends lacks adduser: $depends" ;; esac
case "$depends" in *libc6*) ;; *) fail "Depends lacks libc6: $depends" ;; esac
case "$depends" in *init-system-helpers*) ;; *) fail "Depends lacks init-system-helpers: $depends" ;; esac
mkdir "$tmp/control"
dpkg-deb -e "$deb" "$tmp/control"
conffiles=$(cat "$tmp/control/conffiles" 2>/dev/null || true)
[ "$conffiles" = "$conf" ] || fail "conffiles: '$conffiles', expected '$conf'"
for s in postinst prerm postrm; do
  f="$tmp/control/$s"
  if [ ! -f "$f" ]; then
    fail "no $s"
  elif [ "$(stat -c %a "$f")" != 755 ]; then
    fail "$s has mode $(stat -c %a "$f"), expected 755"
  elif ! sh -n "$f" || { command -v dash >/dev/null && ! dash -n "$f"; }; then
    fail "$s does not parse as sh"
  fi
done
[ "$failed" -ne 0 ] || ok "$(field Package) $(field Version) $(field Architecture); Depends: $depends; conffiles: $conffiles; postinst, prerm, postrm 0755"

# 2. contents: mode, owner and path of every file (directories left out).
echo
echo "== contents"
# cargo-deb writes owners as ids (0/0), dpkg-deb -b as names.
expected="-rwxr-xr-x 0/0 ./usr/bin/poimen-gateway
-rwxr-xr-x 0/0 ./usr/lib/poimen-gateway/reload
-rw-r--r-- 0/0 ./usr/lib/systemd/system/poimen-gateway.service
-rw-r--r-- 0/0 ./usr/lib/sysusers.d/poimen-gateway.conf
-rw-r--r-- 0/0 ./etc/poimen-gateway/gateway.yaml
-rw-r--r-- 0/0 ./usr/share/doc/poimen-gateway/README
-rw-r--r-- 0/0 ./usr/share/doc/poimen-gateway/copyright
-rw-r--r-- 0/0 ./usr/share/lintian/overrides/poimen-gateway"
actual=$(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ { sub("^root/root$", "0/0", $2); print $1, $2, $6 }')
if [ "$(sort <<<"$actual")" = "$(sort <<<"$expected")" ]; then
  ok "$(wc -l <<<"$actual") files, modes and owners as expected"
else
  fail "contents differ from the expected list (< expected, > package):"
  diff <(sort <<<"$expected") <(sort <<<"$actual") >&2 || true
fi

# 3. stripped.
echo
echo "== binary"
mkdir "$tmp/x"
dpkg-deb -x "$deb" "$tmp/x"
bin="$tmp/x/usr/bin/poimen-gateway"
# .debug_gdb_scripts is not debug information: rustc's few bytes naming
# the pretty-printers for gdb, which strip keeps.
sections=$(readelf -SW "$bin" | grep -oE '\.(debug_[a-z_]+|symtab)' | grep -vx '.debug_gdb_scripts' | sort -u | tr '\n' ' ' || true)
if [ -n "$sections" ]; then
  fail "the binary is not stripped: $sections"
else
  ok "stripped ($(du -h "$bin" | cut -f1))"
fi

# 4. lintian.
echo
echo "== lintian $(lintian --version | awk '{print $2}')"
# --fail-on warning: a warning not overridden fails, like an error;
# informational tags (I:) and pedantic ones are printed but do not fail.
if lintian --fail-on error,warning --display-info "$deb"; then
  ok "lintian: no error or warning left (overrides: debian/poimen-gateway.lintian-overrides)"
else
  fail "lintian reports the tags above"
fi

# 5. the packaged config, checked by the packaged binary.
echo
echo "== the packaged binary on the packaged config"
if out=$("$bin" -t -c "$tmp/x$conf" 2>&1); then
  ok "poimen-gateway -t -c $conf: passes"
else
  printf '%s\n' "$out" >&2
  fail "the packaged binary refuses the packaged config"
fi
for exe in $(sed -n 's/^Exec[A-Za-z]*=[-@:+!]*\([^ ]*\).*/\1/p' "$tmp/x/usr/lib/systemd/system/poimen-gateway.service" | sort -u); do
  [ -x "$tmp/x$exe" ] || fail "the unit runs $exe, which the package does not hold as an executable"
done
[ "$failed" -ne 0 ] || ok "every Exec*= program of the unit is in the package"

# 6. the life cycle.
echo
echo "== install, upgrade, remove, purge (chrootless, systemd stubbed)"
# The stubs: each logs "name args" to $calls. `systemctl is-active` succeeds
# when $stub/active exists; a reload fails when $stub/reload-fails exists.
stub="$tmp/stub"
calls="$tmp/calls"
mkdir -p "$stub"
for cmd in systemctl deb-systemd-invoke deb-systemd-helper; do
  cat >"$stub/$cmd" <<EOF
#!/bin/sh
echo "$cmd \$*" >>"$calls"
case "$cmd \$*" in
*" is-active "*) [ -e "$stub/active" ] ;;
"deb-systemd-invoke reload "*) [ ! -e "$stub/reload-fails" ] ;;
esac
EOF
  chmod 0755 "$stub/$cmd"
done

# A newer package: this one repacked as revision 2, its config changed or
# not. dpkg-deb -b, so no second build.
repack() { # repack REVISION CHANGE_CONFIG OUT
  rm -rf "$tmp/repack"
  dpkg-deb -R "$deb" "$tmp/repack"
  sed -i "s/^Version: .*/Version: $version-$1/" "$tmp/repack/DEBIAN/control"
  [ "$2" = no ] || echo "# a change in the packaged config" >>"$tmp/repack$conf"
  dpkg-deb --root-owner-group -Zxz -b "$tmp/repack" "$3" >/dev/null
}
repack 2 no "$tmp/upgrade.deb"
repack 3 yes "$tmp/upgrade-conf.deb"

# A throw-away root with an empty dpkg database and /run/systemd/system, so
# the scripts believe systemd runs there.
newroot() {
  target=$tmp/root
  rm -rf "$target" "$calls"
  mkdir -p "$target/var/lib/dpkg/info" "$target/var/lib/dpkg/updates" "$target/etc" "$target/usr/sbin"
  touch "$target/var/lib/dpkg/status" "$target/etc/passwd" "$target/etc/group" "$target/etc/shadow" "$target/etc/gshadow"
  [ "${1:-}" = no-systemd ] || mkdir -p "$target/run/systemd/system"
  rm -f "$stub/active" "$stub/reload-fails"
  : >"$calls"
}
# dpkg in that root: maintainer scripts run here (chrootless) with DPKG_ROOT
# set; libc6 and adduser are not in that root's database (--force-depends).
dpkg_root() {
  local out
  if ! out=$(PATH="$stub:$PATH" dpkg --root="$target" --force-script-chrootless --force-depends \
    --force-confold "$@" 2>&1); then
    printf '%s\n' "$out" >&2
    fail "dpkg $*"
  fi
  printf '%s\n' "$out" >"$tmp/dpkg.out"
}
called() { grep -qxE "$1" "$calls"; }
step_calls() { tr '\n' ';' <"$calls"; : >"$calls"; }

newroot
dpkg_root -i "$deb"
gid=$(awk -F: '$1 == "poimen-gateway" { print $3 }' "$target/etc/group")
if ! grep -q '^poimen-gateway:' "$target/etc/passwd" || [ -z "$gid" ]; then
  fail "install: no user and group poimen-gateway in the root's /etc/passwd and /etc/group"
elif [ "$(stat -c '%a %u %g' "$target$conf")" != "640 0 $gid" ]; then
  fail "install: $conf is $(stat -c '%a %u %g' "$target$conf"), expected 640 0 $gid (root:poimen-gateway)"
elif called 'systemctl (start|restart|reload|enable).*|deb-systemd-invoke .*'; then
  fail "install: started or enabled the service: $(step_calls)"
elif ! called 'systemctl --system daemon-reload' || ! called 'deb-systemd-helper update-state poimen-gateway.service'; then
  fail "install: no daemon-reload or no update-state: $(step_calls)"
else
  ok "first install: user and group, config 0640 root:poimen-gateway, not started: $(step_calls)"
fi

echo "# the operator's edit" >>"$target$conf"
touch "$stub/active"
: >"$calls"
dpkg_root -i "$tmp/upgrade.deb"
if ! tail -n 1 "$target$conf" | grep -q "operator's edit"; then
  fail "upgrade: the operator's edit of $conf was lost"
elif called '.*(stop|restart|start) .*'; then
  fail "upgrade: stopped or restarted the service: $(step_calls)"
elif [ "$(grep -nE 'daemon-reload|reload poimen' "$calls" | cut -d: -f2- | tr '\n' ';')" != \
  "systemctl --system daemon-reload;deb-systemd-invoke reload poimen-gateway.service;" ]; then
  fail "upgrade of a running service: expected daemon-reload then reload: $(step_calls)"
else
  ok "upgrade, running: edit kept, $(step_calls)"
fi

touch "$stub/reload-fails"
: >"$calls"
dpkg_root -i "$tmp/upgrade.deb"
if ! grep -q 'the reload failed' "$tmp/dpkg.out"; then
  fail "a failed reload: no warning"
elif [ "$(dpkg-query --admindir="$target/var/lib/dpkg" -W -f='${db:Status-Status}' poimen-gateway)" != installed ]; then
  fail "a failed reload left the package unconfigured"
else
  ok "a failed reload: a warning, the package installed: $(step_calls)"
fi
rm -f "$stub/reload-fails" "$stub/active"
: >"$calls"
dpkg_root -i "$tmp/upgrade.deb"
if called '.* reload poimen-gateway.service|.*(stop|restart|start) .*'; then
  fail "upgrade of a stopped service: $(step_calls)"
else
  ok "upgrade, stopped: no reload, no start: $(step_calls)"
fi

: >"$calls"
dpkg_root -i "$tmp/upgrade-conf.deb"
if ! tail -n 1 "$target$conf" | grep -q "operator's edit" || [ ! -f "$target$conf.dpkg-dist" ]; then
  fail "upgrade with a changed config: the edit was not kept, or no $conf.dpkg-dist"
else
  ok "upgrade with a changed packaged config: the edit kept, the new one as gateway.yaml.dpkg-dist"
fi

: >"$calls"
dpkg_root -r poimen-gateway
if ! called 'deb-systemd-invoke stop poimen-gateway.service'; then
  fail "remove: not stopped: $(step_calls)"
elif [ ! -f "$target$conf" ] || [ -e "$target/usr/bin/poimen-gateway" ]; then
  fail "remove: the config is gone or the binary is still there"
else
  ok "remove: stopped, binary gone, config kept: $(step_calls)"
fi

: >"$calls"
dpkg_root -P poimen-gateway
if [ -e "$target/etc/poimen-gateway" ]; then
  fail "purge: $target/etc/poimen-gateway is still there"
elif grep -q gateway.yaml "$target/var/lib/dpkg/statoverride" 2>/dev/null; then
  fail "purge: the config's statoverride is still there"
elif ! called 'deb-systemd-helper purge poimen-gateway.service'; then
  fail "purge: the unit's links were not purged: $(step_calls)"
else
  ok "purge: /etc/poimen-gateway and the statoverride gone: $(step_calls)"
fi

# No systemd in the root (a container, a chroot): no systemctl call at all.
newroot no-systemd
touch "$stub/active"
dpkg_root -i "$deb"
dpkg_root -i "$tmp/upgrade.deb"
dpkg_root -P poimen-gateway
if called 'systemctl .*|deb-systemd-invoke .*'; then
  fail "without systemd: $(step_calls)"
else
  ok "without systemd: install, upgrade and purge call no systemctl: $(step_calls)"
fi

# Where systemd-sysusers is missing, postinst falls back to adduser. Run
# directly (as dpkg would, DPKG_ROOT empty) with a PATH that holds only the
# stubs and the few tools the script uses: adduser, getent and
# dpkg-statoverride stubbed too, so this machine is not changed.
mkdir -p "$tmp/fallback"
for t in sh awk; do ln -s "$(command -v $t)" "$tmp/fallback/$t"; done
for cmd in adduser getent dpkg-statoverride systemctl deb-systemd-invoke deb-systemd-helper; do
  printf '#!/bin/sh\necho "%s $*" >>"%s"\n[ "%s" != getent ]\n' "$cmd" "$calls" "$cmd" >"$tmp/fallback/$cmd"
  chmod 0755 "$tmp/fallback/$cmd"
done
: >"$calls"
if ! PATH="$tmp/fallback" sh "$tmp/control/postinst" configure "" >/dev/null 2>&1; then
  fail "adduser fallback: postinst failed: $(step_calls)"
elif ! called 'adduser --system --group .* poimen-gateway'; then
  fail "adduser fallback: adduser not called: $(step_calls)"
else
  ok "without systemd-sysusers: $(grep '^adduser' "$calls")"
fi

echo
if [ "$failed" -ne 0 ]; then
  echo "check-package: FAILED" >&2
  exit 1
fi
echo "check-package: all checks passed"
