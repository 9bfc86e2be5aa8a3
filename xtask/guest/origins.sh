# The host tests named in foundation.rs for arm64 (every origin of a
# fault, the threaded storm across phase changes, faults that sleep), on
# their own: the arm64 guest's stage.
. /lib.sh
shipped_binary
oracle_setup
host_tests
