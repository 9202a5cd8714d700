#!/usr/bin/env bash
# Regenerates Token.abi and Token.bin from Token.sol with solc-js (npm
# package solc, pinned). Run from anywhere: bash generate.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
npm install --silent --no-audit --no-fund solc@0.8.28 >/dev/null
cp "$here/Token.sol" .
npx --no-install solcjs --optimize --abi --bin -o out Token.sol >/dev/null
cp out/Token_sol_Token.abi "$here/Token.abi"
cp out/Token_sol_Token.bin "$here/Token.bin"
echo "wrote $here/Token.abi and $here/Token.bin"
