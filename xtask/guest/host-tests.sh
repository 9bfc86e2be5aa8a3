# A guest of host tests: the hot patch cases' file system where
# $HOTPATCH_SIZE says, then the host tests named in $HOST_TESTS against the
# oracle, under each backend.
. /lib.sh
[ -n "${HOTPATCH_SIZE:-}" ] && hotpatch_dir $HOTPATCH_SIZE
oracle_setup
host_tests
