#!/usr/bin/env bash
# Idempotent setup of tilecast on Debian: system packages (apt-get) and the Python package (pip).
#   ./install.sh        tilecast and its runtime dependencies
#   ./install.sh test   also the test tools and the numeric reference (torch 2.13.0 CPU, transformers), and
#                       Chromium, in which tests/test_report_browser.py renders the HTML report headless
set -euo pipefail
cd "$(dirname "$0")"

extras=""
case "${1:-}" in
    "") ;;
    test) extras="[test]" ;;
    *) echo "usage: ./install.sh [test]" >&2; exit 2 ;;
esac

packages=(pkg-config gcc libstarpu-dev openmpi-bin libopenmpi-dev)  # Open MPI: StarPU-MPI runs (tilecast run --ranks)
[ -z "$extras" ] || packages+=(chromium)
missing=()
for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing system packages: ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check -e ".${extras}"
