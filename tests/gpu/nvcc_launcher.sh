#!/bin/sh
# CMAKE_CUDA_COMPILER_LAUNCHER for builds with -DDUET_WERROR=ON: the top-level
# add_compile_options(-Werror) reaches nvcc, whose own -Werror takes a value
# and swallows the next argument.  Turn it into nvcc's -Werror=all-warnings.
# (Needed until CMakeLists.txt scopes -Werror to C; see the cuda backend notes.)
cmd="$1"
shift
for a in "$@"; do
  shift
  if [ "$a" = "-Werror" ]; then
    set -- "$@" "-Werror=all-warnings"
  else
    set -- "$@" "$a"
  fi
done
exec "$cmd" "$@"
