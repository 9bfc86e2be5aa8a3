# The host tests named in foundation.rs for arm64 (the threaded storm
# across phase changes, faults that sleep) and every origin of a fault
# (see origins_cases in lib.sh), on their own: the arm64 guest's stage.
. /lib.sh
shipped_binary
oracle_setup
host_tests
origins_cases
