# The foundation and origins guests: the shipped binary, then the host
# tests named in foundation.rs ($HOST_TESTS) against the oracle, under each
# backend.
. /lib.sh
shipped_binary
oracle_setup
host_tests
