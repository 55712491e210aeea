#!/usr/bin/env bash
# ctest kit.self_contained: the GPU kit in .gpu-kit/ (scripts/gpu-kit.sh builds it; CI's gpu-kit
# stage stages one; AUTOSP_KIT_DIR names another) passes its self-containment check (scripts/kit/check.sh). Skips (77) without a kit.
#   self_contained.sh SOURCE_DIR
kit=${AUTOSP_KIT_DIR:-$1/.gpu-kit}
[ -x "$kit/check.sh" ] || { echo "no kit in $kit (run scripts/gpu-kit.sh): skipping"; exit 77; }
exec bash "$kit/check.sh" "$kit"
