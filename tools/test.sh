#!/usr/bin/env bash
# make test's runner: tools/test.sh MODULE GO-TEST-FLAGS...
#
# On two cores a cold run is bound by CPU, so the work is arranged to keep both busy without
# doing anything twice:
#  1. Every package's test binary is compiled once, on every core, and not run (go test
#     -exec true). Otherwise the two jobs below would compile the same dependencies at the
#     same time, each its own copy.
#  2. The tests then run as jobs, TEST_JOBS (2) at a time, longest first: the first package
#     of SLOW_TEST_PKGS (test/e2e, mostly waiting on its apiservers); then every package not
#     in that list, one at a time, in one go test; then the rest of the list, each a job of
#     its own, taken by whichever runner is free first.
# A job's output is printed whole when it ends, with its time; the run fails if any job
# failed, and says which. With TEST_COMPILED_FILE set, that file is created once step 1 is
# done (.ci/run waits for it to start make test-node).
set -uo pipefail

module=${1:?usage: tools/test.sh MODULE GO-TEST-FLAGS...}
shift
flags=("$@")
go=${GO:-go}
read -r -a slow <<<"${SLOW_TEST_PKGS:-}"
parallel=${TEST_JOBS:-2}

dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT

began=$SECONDS
if ! "$go" test "${flags[@]}" -run '^$' -exec true ./... >"$dir/build.log" 2>&1; then
	cat "$dir/build.log"
	echo "make test: compiling the tests failed" >&2
	exit 1
fi
echo "make test: every test binary compiled in $((SECONDS - began)) s"
# .ci/run starts make test-node once this file exists: from here on the two share the
# compiled dependencies instead of compiling them at the same time.
if [ -n "${TEST_COMPILED_FILE:-}" ]; then
	touch "$TEST_COMPILED_FILE"
fi

# packages[i] is a job's list of packages; label[i] names it.
packages=() label=()
add_job() { packages+=("$1"); label+=("$2"); }
if [ ${#slow[@]} -gt 0 ]; then
	add_job "./${slow[0]}/" "${slow[0]}"
fi
others=$("$go" list ./... | grep -vxF -f <(printf "$module/%s\n" "${slow[@]}")) || {
	echo "make test: go list ./... failed" >&2
	exit 1
}
add_job "$others" "the other packages"
for p in "${slow[@]:1}"; do
	add_job "./$p/" "$p"
done

declare -A job_of
started=() failed=()
running=0
# finish waits for one job to end and prints its output.
finish() {
	local pid rc=0
	wait -n -p pid || rc=$?
	local i=${job_of[$pid]}
	cat "$dir/$i.log"
	local verdict=ok
	[ "$rc" = 0 ] || { verdict=FAILED; failed+=("${label[i]}"); }
	echo "make test: ${label[i]}: $verdict in $((SECONDS - started[i])) s"
	running=$((running - 1))
}
for i in "${!packages[@]}"; do
	[ "$running" -lt "$parallel" ] || finish
	started[i]=$SECONDS
	# shellcheck disable=SC2086 # a job is a space-separated list of packages
	"$go" test -p 1 "${flags[@]}" ${packages[i]} >"$dir/$i.log" 2>&1 &
	job_of[$!]=$i
	running=$((running + 1))
done
while [ "$running" -gt 0 ]; do finish; done

echo "make test: $((SECONDS - began)) s in all"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'make test: FAILED: %s\n' "${failed[@]}" >&2
	exit 1
fi
