#!/usr/bin/env bash
# Builds the Debian package target/debian/poimen-gateway_<version>_<arch>.deb
# with cargo-deb, from [package.metadata.deb] in Cargo.toml (what goes where,
# and why, is said there). Installs cargo-deb first if it is missing or not
# the pinned version. Prints the package's path last.
#
# A release build of the gateway alone (not the simulator): several minutes
# on 2 cores from scratch, seconds when target/release is current.
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned, so that a new cargo-deb cannot change the package under us; bump it
# on purpose and run scripts/check-package.sh.
CARGO_DEB_VERSION=3.8.0

if ! cargo deb --version 2>/dev/null | grep -qx "cargo-deb $CARGO_DEB_VERSION"; then
  echo "package: installing cargo-deb $CARGO_DEB_VERSION"
  cargo install cargo-deb --version "$CARGO_DEB_VERSION" --locked
fi

# --strip: cargo-deb keeps debug sections when the release profile has
# `debug = ...` (ours: line-tables-only, for development); the package ships
# the binary stripped as dh_strip would. --locked: the versions of Cargo.lock,
# as CI builds.
cargo deb -p poimen-gateway --strip --locked "$@"
