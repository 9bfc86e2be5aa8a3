# Every origin of a fault (see origins_cases in lib.sh), and the threaded
# storm across phase changes (storm_cases), on their own: the arm64
# guest's stage of the origin and storm tests.
. /lib.sh
shipped_binary
oracle_setup
origins_cases
storm_cases
