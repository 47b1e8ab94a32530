#!/usr/bin/env bash
# Every C source and header of the repository is laid out as .clang-format
# says: clang-format --dry-run -Werror finds nothing to change. Skipped
# (exit 77) only when no clang-format is installed; deploy/install-deps.sh
# installs Debian's.
#   test_format.sh [CLANG_FORMAT]   (CHARGED_SOURCE_DIR: the repository)
set -euo pipefail
src=${CHARGED_SOURCE_DIR:?}
cf=${1:-$(command -v clang-format || true)}
if [ -z "$cf" ] || ! [ -x "$cf" ]; then
  echo "clang-format not found: skipped (deploy/install-deps.sh installs it)"
  exit 77
fi
cd "$src"
# The tracked files; outside a git checkout (a source tarball), the
# source folders, without build trees.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -d '' files < <(git ls-files -z -- '*.c' '*.h')
else
  mapfile -d '' files < <(find bench common examples tests tools worker \
    -path '*/build*' -prune -o \( -name '*.c' -o -name '*.h' \) -print0 2>/dev/null)
fi
if [ ${#files[@]} -eq 0 ]; then
  echo "no C files found under $src"
  echo "0 passed, 1 failed"; exit 1
fi
if ! "$cf" --style=file --dry-run -Werror "${files[@]}"; then
  echo "not formatted: run clang-format -i on the files above"
  echo "0 passed, 1 failed"; exit 1
fi
echo "${#files[@]} files formatted; 1 passed, 0 failed"
