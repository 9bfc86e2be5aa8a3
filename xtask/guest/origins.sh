# Every origin of a fault (see origins_cases in lib.sh), the threaded
# storm across phase changes (storm_cases) and faults that sleep
# (userfault_cases), on their own: the arm64 guest's stage of the origin,
# storm and sleeping-fault tests.
. /lib.sh
shipped_binary
oracle_setup
origins_cases
storm_cases
userfault_cases
