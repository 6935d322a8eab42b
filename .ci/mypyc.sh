# The compiled (mypyc) build of the core, tested: sourced by .ci/run, which calls
#
#     mypyc_core_tests PYTHON
#
# PYTHON is an interpreter with the test dependencies (the CI's .venv/bin/python).  The wheel is
# built as a user would build it (NSQ_SANSIO_MYPYC=1 pip wheel: an isolated build that fetches
# setuptools and mypy itself) from a copy of the checkout, so that no compiled module lands in
# the source tree (it would shadow the .py files of the editable install).  The compiled modules
# are put next to the sources of that copy and the core's tests run there: the protocol core's
# own tests, the spec fixtures and the emulator's tests (which drive the core end to end).
# Returns pytest's status (the build failing is status 1).  About 1.5 min on 2 cores.
mypyc_core_tests() {
    local python=${1:-.venv/bin/python}
    local root work status=0
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    python=$(cd "$(dirname "$python")" && pwd)/$(basename "$python")
    work=$(mktemp -d)
    mkdir "$work/src"
    # the recorded captures some tests read sit next to the checkout (../shared), when present
    if [[ -d $root/../shared ]]; then
        ln -s "$(cd "$root/../shared" && pwd)" "$work/shared"
    fi
    # the files of the checkout as git sees them (tracked, and new ones not ignored)
    (cd "$root" && git ls-files -z --cached --others --exclude-standard |
        tar -c --null -T -) | tar -x -C "$work/src" -f - || {
        rm -rf "$work"
        return 1
    }
    local started=$SECONDS
    if ! (cd "$work/src" && NSQ_SANSIO_MYPYC=1 "$python" -m pip wheel --quiet --no-deps \
        -w "$work/dist" . >"$work/build.log" 2>&1); then
        cat "$work/build.log"
        echo "the mypyc build failed"
        rm -rf "$work"
        return 1
    fi
    echo "mypyc build: $((SECONDS - started)) s"
    local wheel=("$work"/dist/*.whl)
    "$python" -m zipfile -e "${wheel[0]}" "$work/wheel"
    (cd "$work/wheel" && find . -name '*.so' -exec cp --parents {} "$work/src" \;)
    (cd "$work/src" && PYTHONPATH="$work/src" "$python" - <<'EOF'
import nsq_proto._connection as m
import tests.compiled as c
assert c.COMPILED, f"the core is not the compiled one: {m.__file__}"
print("compiled core:", m.__file__)
EOF
    ) || status=1
    if ((status == 0)); then
        (cd "$work/src" && PYTHONPATH="$work/src" "$python" -m pytest -q -p no:cacheprovider \
            -m "not spark and not real_nsqd" tests/proto tests/test_spec_fixtures.py \
            tests/emulator) || status=$?
    fi
    rm -rf "$work"
    return "$status"
}
