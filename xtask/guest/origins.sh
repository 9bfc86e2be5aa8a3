# Every origin of a fault (see origins_cases in lib.sh), on its own: the
# arm64 guest's stage of the origin test.
. /lib.sh
shipped_binary
oracle_setup
origins_cases
